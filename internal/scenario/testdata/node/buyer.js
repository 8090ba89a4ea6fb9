'use strict';
// The Node.js buyer of the fenced flash sale (fencing_test.go): one process
// that buys one unit of one SKU kept in PostgreSQL, as the Go buyer
// (testdata/buyer) does in -mode fenced, through locking-mlock's execute
// (the MlockLockingProvider of Medusa's Locking Module, namespace '' so
// that its keys are the Go buyers' resources) and mlock's fencedTransaction
// with the token execute hands the job.
//
//   node buyer.js JS_DIR URI PG_URL SALE SKU TTL_MS PAUSE PAUSE_INSIDE
//
// It prints "ready", waits for its standard input to close, and prints the
// same lines as the Go buyer: "pause PID" before it stops itself (SIGSTOP),
// then "sold SKU SALEID TOKEN", "stale SKU TOKEN HIGHEST", "soldout SKU" or
// "error WHAT". Exit status 0, or 1 after an error.
const path = require('node:path');
const { createRequire } = require('node:module');

const [js, uri, pgURL, sale, skuArg, ttlArg, pauseArg, insideArg] = process.argv.slice(2);
const sku = Number(skuArg);
const pause = pauseArg === 'true';
const inside = insideArg === 'true';
const jsRequire = createRequire(path.join(js, 'package.json'));
const { Pool } = jsRequire('pg');
const { fencedTransaction, StaleTokenError } = jsRequire(path.join(js, 'packages', 'mlock'));
const { MlockLockingProvider } = jsRequire(path.join(js, 'packages', 'locking-mlock'));

const say = (line) => new Promise((resolve) => process.stdout.write(line + '\n', resolve));
// Stops the process until the test resumes it (SIGCONT), once the line is out.
const stop = async () => {
  await say(`pause ${process.pid}`);
  process.kill(process.pid, 'SIGSTOP');
};

// buy reads the stock, stops (with PAUSE) and writes the sale in a
// transaction fenced by the lease's token; it returns the outcome's line.
async function buy(pool, res, lease) {
  const { rows } = await pool.query('SELECT stock FROM skus WHERE sale = $1 AND sku = $2', [sale, sku]);
  if (rows[0].stock <= 0) return `soldout ${sku}`;
  if (pause && !inside) await stop();
  try {
    return await fencedTransaction(pool, lease.token, res, async (db) => {
      if (pause && inside) await stop();
      const r = await db.query('SELECT stock FROM skus WHERE sale = $1 AND sku = $2', [sale, sku]);
      if (r.rows[0].stock <= 0) return `soldout ${sku}`;
      await db.query('UPDATE skus SET stock = $3 WHERE sale = $1 AND sku = $2', [sale, sku, r.rows[0].stock - 1]);
      const ins = await db.query('INSERT INTO sales (sale, sku, token) VALUES ($1, $2, $3) RETURNING id', [sale, sku, lease.token]);
      return `sold ${sku} ${ins.rows[0].id} ${lease.token}`;
    });
  } catch (e) {
    if (e instanceof StaleTokenError) return `stale ${sku} ${e.token} ${e.highest}`;
    throw e;
  }
}

async function main() {
  const pool = new Pool({ connectionString: pgURL, max: 2 });
  const provider = new MlockLockingProvider({}, { url: uri, namespace: '', waitLockingTimeout: 60 });
  try {
    await pool.query('SELECT 1');
    await say('ready');
    await new Promise((resolve) => {
      process.stdin.on('end', resolve);
      process.stdin.resume();
    });
    const res = `sale:${sale}:sku:${sku}`;
    // The job says its outcome as it ends: execute then throws if the lock
    // was lost meanwhile (a stopped buyer's was), which does not undo a
    // committed sale. A job that did not start (not granted, a server
    // restarting) is asked again, for at most 3 minutes.
    let out;
    let started = false;
    const until = Date.now() + 180_000;
    while (out === undefined) {
      try {
        await provider.execute(res, async (_signal, lease) => {
          started = true;
          out = await buy(pool, res, lease);
        }, { timeout: 60, expire: Number(ttlArg) / 1000 });
      } catch (e) {
        if (out !== undefined) break;
        if (started || Date.now() > until) throw e;
        await new Promise((r) => setTimeout(r, 100)); // before asking again
      }
    }
    await say(out);
  } finally {
    await provider.shutdown().catch(() => undefined);
    await pool.end().catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  async (e) => {
    await say(`error ${String(e && e.stack ? e.stack : e).replace(/\n/g, ' ')}`);
    process.exit(1);
  },
);
