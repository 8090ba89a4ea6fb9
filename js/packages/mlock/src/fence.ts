/**
 * Fenced writes to PostgreSQL: a transaction's writes are kept only if the
 * lock's fencing token is at least the highest one recorded for each of its
 * resources, and the transaction records it (the same table and statements
 * as the Go package fence/postgres, so Go and Node.js writers share one
 * fence).
 *
 * It needs no PostgreSQL driver of its own: it takes the `pg` package's
 * Pool or Client (or anything with the same `query`, and for a pool
 * `connect`/`release`).
 *
 *     await client.execute('sku:1', async (signal, lock) => {
 *       await fencedTransaction(pool, lock.token, lock.resources, async (db) => {
 *         const { rows } = await db.query('SELECT stock FROM skus WHERE sku = 1');
 *         await db.query('UPDATE skus SET stock = $1 WHERE sku = 1', [rows[0].stock - 1]);
 *       });
 *     });
 */

/** Creates the fence table (once, or in a migration). */
export const FENCE_SCHEMA = `CREATE TABLE IF NOT EXISTS mlock_fence (
    resource text PRIMARY KEY,
    token    bigint NOT NULL
)`;

/** Records a token ($2) for a resource ($1), or returns no row if a higher one is recorded. */
export const FENCE_CHECK_SQL = `INSERT INTO mlock_fence (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
WHERE mlock_fence.token <= EXCLUDED.token
RETURNING token`;

const HIGHEST_SQL = 'SELECT token FROM mlock_fence WHERE resource = $1';

/** What the fence runs its statements on: a `pg` Client, or a Pool's client. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
}

/** A `pg` Pool: connect() lends a client that release() gives back. */
export interface PoolLike {
  connect(): Promise<Queryable & { release(err?: Error | boolean): void }>;
}

/** A fencing token: the lock's (a number), or a bigint or decimal string. */
export type Token = number | bigint | string;

/**
 * A write refused because its token is lower than one already recorded for
 * the resource: a newer holder has written. Its transaction was rolled back.
 * `code` is `'STALE_TOKEN'`.
 */
export class StaleTokenError extends Error {
  readonly code = 'STALE_TOKEN';
  constructor(
    /** The resource whose recorded token is higher. */
    readonly resource: string,
    /** The token the write carried, as a decimal string. */
    readonly token: string,
    /** The token recorded when the write was refused, as a decimal string ('' if unknown). */
    readonly highest: string,
  ) {
    super(`stale fencing token ${token} for "${resource}": ${highest ? `token ${highest} has written since` : 'a newer holder has written'}`);
    this.name = 'StaleTokenError';
  }
}

const MAX_TOKEN = (1n << 63n) - 1n;

/**
 * The token as a decimal string and the resources sorted without
 * duplicates (the order the fence rows are taken in: two transactions never
 * wait for each other in a cycle). Throws a TypeError for a token that is
 * not a whole number from 1 to 2^63 - 1, or no resource, or an empty name.
 */
export function fenceArgs(token: Token, resources: string | string[]): { token: string; resources: string[] } {
  let t: bigint;
  try {
    if (typeof token === 'number' && !Number.isSafeInteger(token)) throw new Error();
    t = BigInt(token);
  } catch {
    throw new TypeError(`fence: the token ${String(token)} is not a whole number`);
  }
  if (t < 1n || t > MAX_TOKEN) throw new TypeError(`fence: the token ${t} is not from 1 to ${MAX_TOKEN} (0: the lock has no fencing token)`);
  const list = typeof resources === 'string' ? resources.split('|') : [...resources];
  if (list.length === 0 || list.some((r) => typeof r !== 'string' || r === '')) throw new TypeError('fence: no resource, or an empty resource name');
  return { token: t.toString(), resources: [...new Set(list)].sort() };
}

/**
 * Checks token against, and records it for, each resource ('a|b' or a
 * list), inside the transaction open on db. Resolves when the token is at
 * least the highest recorded for each (an equal one is the same holder
 * writing again); rejects with a StaleTokenError when it is lower for one of
 * them, or with the database's error. After a rejection the caller must roll
 * the transaction back (fencedTransaction does).
 */
export async function checkFence(db: Queryable, token: Token, resources: string | string[]): Promise<void> {
  const a = fenceArgs(token, resources);
  for (const r of a.resources) {
    const { rows } = await db.query(FENCE_CHECK_SQL, [r, a.token]);
    if (rows.length === 0) {
      let highest = '';
      try {
        const h = await db.query(HIGHEST_SQL, [r]);
        if (h.rows.length > 0) highest = String(h.rows[0].token);
      } catch {
        // the refusal stands without the number
      }
      throw new StaleTokenError(r, a.token, highest);
    }
  }
}

/** Whether db is a pool: a `pg` Pool (it counts its clients), or anything with connect() and no query(). */
function isPool(db: PoolLike | Queryable): db is PoolLike {
  const d = db as Partial<PoolLike & Queryable> & { totalCount?: unknown };
  if (typeof d.connect !== 'function') return false;
  return typeof d.query !== 'function' || typeof d.totalCount === 'number';
}

/**
 * Runs fn in a transaction fenced by token on resources: BEGIN, checkFence,
 * fn(db), COMMIT. If the check or fn fails it rolls back and rejects with
 * that error (a StaleTokenError for a stale token, fn not run). db is a
 * `pg` Pool (a client is taken from it and given back), or a connected
 * `pg` Client (or a pool's client) not in a transaction. fn should read what its writes depend on through the db it is
 * given, inside the transaction: it then sees what the last accepted holder
 * left.
 */
export async function fencedTransaction<T>(db: PoolLike | Queryable, token: Token, resources: string | string[], fn: (db: Queryable) => Promise<T>): Promise<T> {
  fenceArgs(token, resources); // a bad call rejects before a connection is taken
  const pooled = isPool(db);
  const conn = pooled ? await db.connect() : (db as Queryable);
  let broken: Error | undefined;
  try {
    await conn.query('BEGIN');
    try {
      await checkFence(conn, token, resources);
      const result = await fn(conn);
      await conn.query('COMMIT');
      return result;
    } catch (e) {
      await conn.query('ROLLBACK').catch((re: Error) => {
        broken = re;
      });
      throw e;
    }
  } finally {
    if (pooled) (conn as Queryable & { release(err?: Error | boolean): void }).release(broken);
  }
}
