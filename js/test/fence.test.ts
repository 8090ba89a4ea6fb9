// Fenced writes to PostgreSQL (mlock's fencedTransaction) against a real
// PostgreSQL, and the token reaching the job through the client's execute
// and locking-mlock's execute, on a real mlockd. go test ./internal/jstest
// starts a private PostgreSQL and names it in MLOCK_TEST_PG_URL; without it
// the suite is skipped, except under CI=true, where it fails.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Pool } from 'pg';
import Client, { FENCE_SCHEMA, StaleTokenError, checkFence, fencedTransaction } from 'mlock';
import { MlockLockingProvider } from 'locking-mlock';
import { type Server, startServer } from './helpers';

const PG_URL = process.env.MLOCK_TEST_PG_URL ?? '';
const inCI = process.env.CI === 'true';

if (!PG_URL && inCI) {
  test('PostgreSQL', () => assert.fail('MLOCK_TEST_PG_URL is not set: the fence suite is required under CI=true'));
}

describe('fencedTransaction on PostgreSQL', { skip: PG_URL ? false : 'MLOCK_TEST_PG_URL is not set (go test ./internal/jstest sets it)' }, () => {
  let pool: Pool;
  let srv: Server;
  let n = 0;
  const res = (name: string) => `${name}-${process.pid}-${++n}`;
  before(async () => {
    pool = new Pool({ connectionString: PG_URL, max: 30 });
    await pool.query(FENCE_SCHEMA);
    await pool.query(FENCE_SCHEMA); // IF NOT EXISTS
    await pool.query('CREATE TABLE IF NOT EXISTS js_counter (resource text PRIMARY KEY, n int NOT NULL)');
    await pool.query('CREATE TABLE IF NOT EXISTS js_writes (id bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL, seen int NOT NULL)');
    srv = await startServer();
  });
  after(async () => {
    await pool.end();
    await srv.cleanup();
  });

  /** A fenced read-modify-write of r's counter, logged with its token. */
  const write = (token: number, r: string) =>
    fencedTransaction(pool, token, r, async (db) => {
      const { rows } = await db.query('SELECT n FROM js_counter WHERE resource = $1', [r]);
      const seen = rows.length ? Number(rows[0].n) : 0;
      await db.query('INSERT INTO js_counter VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET n = $2', [r, seen + 1]);
      await db.query('INSERT INTO js_writes (resource, token, seen) VALUES ($1, $2, $3)', [r, token, seen]);
      return seen;
    });

  test('a stale token is refused with a StaleTokenError and its transaction rolled back', async () => {
    const r = res('sku');
    assert.equal(await write(5, r), 0);
    assert.equal(await write(5, r), 1); // the same holder again
    assert.equal(await write(9, r), 2);
    const err = await write(5, r).then(() => undefined, (e) => e);
    assert.ok(err instanceof StaleTokenError, String(err));
    assert.equal(err.code, 'STALE_TOKEN');
    assert.equal(err.resource, r);
    assert.equal(err.token, '5');
    assert.equal(err.highest, '9');
    const { rows } = await pool.query('SELECT (SELECT n FROM js_counter WHERE resource = $1) AS n, (SELECT count(*) FROM js_writes WHERE resource = $1)::int AS w', [r]);
    assert.deepEqual(rows[0], { n: 3, w: 3 });

    // A failing job: its writes and its token rolled back.
    await assert.rejects(
      fencedTransaction(pool, 20, r, async (db) => {
        await db.query('UPDATE js_counter SET n = 100 WHERE resource = $1', [r]);
        throw new Error('boom');
      }),
      /boom/,
    );
    const after = await pool.query('SELECT (SELECT n FROM js_counter WHERE resource = $1) AS n, (SELECT token FROM mlock_fence WHERE resource = $1) AS t', [r]);
    assert.deepEqual(after.rows[0], { n: 3, t: '9' });

    // checkFence in the caller's own transaction, on a client of the pool, two resources.
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      await checkFence(c, 10, [r, r + ':b']);
      await c.query('COMMIT');
      await c.query('BEGIN');
      await assert.rejects(checkFence(c, 9, `${r}|${r}:b`), (e: unknown) => e instanceof StaleTokenError && e.highest === '10');
      await c.query('ROLLBACK');
      // fencedTransaction on the client itself (not the pool).
      assert.equal(await fencedTransaction(c, 11, r, async (db) => (await db.query('SELECT 1 AS one')).rows[0].one), 1);
    } finally {
      c.release();
    }

    // Bad calls: refused before anything is sent.
    for (const bad of [0, -1, 1.5, Number.MAX_SAFE_INTEGER + 2, '2x', 2n ** 63n]) {
      await assert.rejects(fencedTransaction(pool, bad as number, r, async () => assert.fail('ran')), TypeError, String(bad));
    }
    await assert.rejects(fencedTransaction(pool, 1, [], async () => assert.fail('ran')), TypeError);
  });

  test('concurrent stale and fresh writers: accepted in token order, each reading the one before', async () => {
    const r = res('hot');
    const count = 40;
    const tokens = Array.from({ length: count }, (_, i) => i + 1).sort(() => Math.random() - 0.5);
    const outcomes = await Promise.allSettled(tokens.map((t) => write(t, r)));
    let accepted = 0;
    outcomes.forEach((o, i) => {
      if (o.status === 'fulfilled') accepted++;
      else {
        assert.ok(o.reason instanceof StaleTokenError, String(o.reason));
        assert.equal(o.reason.token, String(tokens[i]));
        assert.ok(BigInt(o.reason.highest) > BigInt(tokens[i]), `refusal of ${tokens[i]} names ${o.reason.highest}`);
      }
    });
    const { rows } = await pool.query('SELECT token::int AS token, seen FROM js_writes WHERE resource = $1 ORDER BY id', [r]);
    rows.forEach((w, k) => {
      assert.equal(w.seen, k, `write ${k} read ${w.seen}`);
      if (k > 0) assert.ok(w.token > rows[k - 1].token, `write ${k}: token ${w.token} after ${rows[k - 1].token}`);
    });
    assert.equal(rows.length, accepted);
    assert.equal(rows[rows.length - 1].token, count, 'the highest token is always accepted');
    console.log(`${count} writers: ${accepted} accepted, ${count - accepted} refused as stale`);
  });

  test("the client's execute and locking-mlock's execute hand the job its token", async () => {
    const r = res('exec');
    const client = new Client(`mlock://${srv.addr}`);
    const provider = new MlockLockingProvider({}, { url: `mlock://${srv.addr}`, namespace: '' });
    try {
      const tokens: number[] = [];
      await client.execute(r, async (_signal, lock) => {
        tokens.push(lock.token);
        await fencedTransaction(pool, lock.token, lock.resources, async (db) => db.query('SELECT 1'));
      });
      await provider.execute(r, async (_signal, lease) => {
        assert.ok(lease, 'execute passed no lease');
        assert.equal(lease.resources, r);
        tokens.push(lease.token);
        await fencedTransaction(pool, lease.token, r, async (db) => db.query('SELECT 1'));
      });
      assert.ok(tokens[0] > 0 && tokens[1] > tokens[0], `tokens ${tokens}`);
      // The first holder's token is stale now.
      await assert.rejects(fencedTransaction(pool, tokens[0], r, async () => undefined), StaleTokenError);
    } finally {
      client.destroy();
      await provider.shutdown();
    }
  });
});
