/**
 * mlock: the Node.js client of mlockd, the multi-resource distributed lock
 * server. The seed's API (`new Mlock(uri)`, `lock`, `extend`, `unlock`,
 * `ping`, `status`, `destroy`, `MlockError`) plus promises with AbortSignal,
 * lock handles with fencing tokens and a `'lost'` event, `execute` with
 * renewal, owners, release/releaseAll/renew, try-lock, explicit resource
 * management (`await using`) and failover across cluster nodes.
 *
 * `require('mlock')` is the client class (as the original's README shows);
 * `import Mlock, { MlockError } from 'mlock'` works too.
 */
import { Mlock } from './client';

export { Mlock };
export { Mlock as Client };
export default Mlock;
export type { LockOptions, CallOptions, ExecuteOptions, Status, Renewal } from './client';
export { Lock } from './session';
export type { LockState } from './session';
export { MlockError } from './errors';
export type { MlockErrorType, MlockErrorDetails } from './errors';
export { parseURI, DEFAULT_PORT } from './options';
export { validName, validOwner } from './rules';
export type { MlockOptions } from './options';
export { FENCE_SCHEMA, FENCE_CHECK_SQL, StaleTokenError, checkFence, fencedTransaction, fenceArgs } from './fence';
export type { Queryable, PoolLike, Token } from './fence';

// CommonJS: require('mlock') is the class itself, with every export on it.
declare const module: { exports: Record<string, unknown> };
module.exports = Object.assign(Mlock, module.exports);
