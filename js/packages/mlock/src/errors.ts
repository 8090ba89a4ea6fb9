/**
 * The kinds of {@link MlockError}. The first four are those of the original
 * mlock client:
 *
 * - `connection`: the server could not be reached, the connection broke while
 *   the call was in flight, the server refused the connection (credentials,
 *   limits), or the client was destroyed.
 * - `request`: the server (or the client, before sending) refused the
 *   request's arguments.
 * - `tolerate`: a queue was longer than the request's `tolerate`, or a
 *   try-lock found a resource taken (`reason` is then `resource is locked!`
 *   and `resource` names it).
 * - `timeout`: the wait for a lock passed its timeout (or, reason
 *   `deadline`, a call passed the `deadline` its caller gave).
 *
 * Additions:
 *
 * - `lost`: a held lock is gone: it expired, was released by its owner
 *   elsewhere, its session was lost (server restart, grace period over), or
 *   its deadline passed without word from the server.
 * - `canceled`: the caller gave the call up through its `AbortSignal`
 *   (`cause` is the signal's reason).
 */
export type MlockErrorType = 'connection' | 'request' | 'tolerate' | 'timeout' | 'lost' | 'canceled';

/** Details of an {@link MlockError}; all optional. */
export interface MlockErrorDetails {
  /** The server's failure text, e.g. `can not tolerate!`, `lock not exist!`. */
  reason?: string;
  /** The resource the server named as busy or conflicting. */
  resource?: string;
  /** The server (`host:port`) a connection error concerns. */
  node?: string;
  /** The underlying error (a socket error, an abort reason). */
  cause?: unknown;
}

/** The error of every client call. `type` classifies it (see {@link MlockErrorType}). */
export class MlockError extends Error {
  readonly type: MlockErrorType;
  readonly reason?: string;
  readonly resource?: string;
  readonly node?: string;

  constructor(message: string, type: MlockErrorType, details: MlockErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = 'MlockError';
    this.type = type;
    if (details.reason !== undefined) this.reason = details.reason;
    if (details.resource !== undefined) this.resource = details.resource;
    if (details.node !== undefined) this.node = details.node;
  }
}

/** Failure reasons after which the server names a resource. */
const withResource = ['resource is locked!', 'owner holds an overlapping lock!', 'permission denied!'];

/** Maps a `result <req> failed <text>` to an error. */
export function failure(text: string): MlockError {
  let reason = text;
  let resource: string | undefined;
  for (const r of withResource) {
    if (text.startsWith(r + ' ')) {
      reason = r;
      resource = text.slice(r.length + 1);
      break;
    }
  }
  const type = reason === 'can not tolerate!' || reason === 'resource is locked!' ? 'tolerate' : 'request';
  return new MlockError(resource ? `${reason} ${resource}` : reason, type, { reason, resource });
}

/** The error of a call given up through its signal. */
export function canceled(signal: AbortSignal): MlockError {
  return new MlockError('call canceled', 'canceled', { cause: signal.reason });
}
