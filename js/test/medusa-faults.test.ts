// locking-mlock in the real @medusajs/locking module: execute's timeout
// while mlockd is stopped, the abort reason of a job whose server shut down,
// and namespaces that never release each other's locks. (The upstream cases
// are in medusa.test.ts; each file runs in its own process, side by side.)
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Client, { MlockError } from 'mlock';
import { encode } from 'mlock/dist/framing';
import { MedusaError } from '@medusajs/framework/utils';
import { fakeServer, queued, sleep, startProxy, startServer } from './helpers';
import { LOCKING_MLOCK, loadLocking, registration } from './medusa';

describe('locking-mlock: the server going away, namespaces, the causes of a loss', () => {
  const k = (name: string) => `${name}-${process.pid}-away`;

  test('with mlockd stopped, execute({timeout: 2}) fails after about 2 s as locking-redis does; it succeeds when mlockd is back in time', async () => {
    const s = await startServer();
    try {
      const svc = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${s.addr}` } });
      await svc.execute(k('warm'), async () => undefined);
      await s.stop();
      let ran = false;
      const t0 = Date.now();
      const e = await svc.execute(k('down'), async () => (ran = true), { timeout: 2 }).then(() => undefined, (err: unknown) => err);
      const took = Date.now() - t0;
      assert.ok(e instanceof MedusaError, `${e}`);
      assert.equal((e as MedusaError).type, MedusaError.Types.CONFLICT);
      assert.equal((e as Error).message, 'Timed-out acquiring lock.');
      assert.ok((e as Error).cause instanceof MlockError, 'our error is kept as the cause');
      assert.equal(((e as Error).cause as MlockError).type, 'connection');
      assert.ok(took >= 1900 && took < 3500, `rejected after ${took} ms`);
      assert.equal(ran, false);

      const p = svc.execute(k('back'), async () => 'ran', { timeout: 5 });
      await sleep(1000);
      await s.start();
      assert.equal(await p, 'ran');
    } finally {
      await s.cleanup();
    }
  });

  test('a process awaiting execute while mlockd is unreachable stays alive until the timeout', () => {
    // A child process with nothing else to keep it alive, whose provider
    // dials a port where nothing listens: between two tries of the call the
    // client holds nothing open (each round of dials is refused at once),
    // so the pause between the tries must. Before, it was unref'd, and the
    // process exited with execute pending, its job neither run nor failed.
    const dir = mkdtempSync(join(tmpdir(), 'mlock-medusa-alive-'));
    try {
      const script = join(dir, 'child.js');
      writeFileSync(
        script,
        `const net = require('node:net');
const { MlockLockingProvider } = require(process.env.LOCKING_MLOCK);
const probe = net.createServer().listen(0, '127.0.0.1', () => {
  const port = probe.address().port;
  probe.close(async () => {
    const p = new MlockLockingProvider({}, { url: 'mlock://127.0.0.1:' + port });
    const t0 = Date.now();
    const outcome = await p.execute('alive', async () => 'ran', { timeout: 2 }).then((r) => r, (e) => e.message);
    console.log(outcome + ' after ' + (Date.now() - t0) + ' ms');
    await p.shutdown();
  });
});
`,
      );
      const out = execFileSync(process.execPath, [script], { env: { ...process.env, LOCKING_MLOCK }, encoding: 'utf8', timeout: 30000 });
      const m = /^Timed-out acquiring lock\. after (\d+) ms/.exec(out);
      assert.ok(m, `the child printed ${JSON.stringify(out)}`);
      assert.ok(Number(m[1]) >= 1900, `it gave up after ${m[1]} ms, before its timeout`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a job's abort reason names a server shutdown, not a short lease", async () => {
    const s = await startServer();
    try {
      const svc = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${s.addr}` } });
      let reason: unknown;
      const p = svc.execute(k('shutdown'), async (signal) => {
        void s.stop();
        if (!signal!.aborted) await new Promise<void>((res) => signal!.addEventListener('abort', () => res()));
        reason = signal!.reason;
        return 'finished anyway';
      }, { expire: 30 });
      await assert.rejects(p, (e: Error & { type?: string }) => e.type === 'conflict' && /the lock server shut down/.test(e.message) && !/Increase "expire"/.test(e.message));
      assert.ok(reason instanceof MedusaError && /shut down/.test(reason.message), `${reason}`);
      assert.ok((reason as Error).cause instanceof MlockError && ((reason as Error).cause as MlockError).reason === 'shutdown');
    } finally {
      await s.cleanup();
    }
  });

  test("two namespaces never release each other's locks, and releaseAll never stops an mlock run outside its namespace", async (t) => {
    const cli = process.env.MLOCK_CLI;
    if (!cli) {
      if (process.env.CI === 'true') assert.fail('MLOCK_CLI is not set');
      t.skip('MLOCK_CLI is not set (go test ./internal/jstest/ sets it)');
      return;
    }
    const s = await startServer();
    const c = new Client({ host: '127.0.0.1', port: s.port });
    try {
      const shopA = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${s.addr}`, namespace: 'medusa_lock:' } });
      const shopB = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${s.addr}`, namespace: 'shopB:' } });
      const job = 'report:nightly';
      const run = spawn(cli, ['run', '--uri', `mlock://${s.addr}`, '--owner', 'u1', '--ttl', '10s', job, '--', 'sleep', '2'], { stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      run.stderr!.on('data', (d) => (stderr += d));
      const exited = new Promise<number | null>((res) => run.on('exit', (code) => res(code)));
      await queued(c, job, 1);
      for (const shop of [shopA, shopB]) {
        await shop.acquire(k('cart'), { ownerId: 'u1', expire: 30 });
        await shop.acquire(k('anon'), { expire: 30 });
      }
      await shopA.releaseAll({ ownerId: 'u1' });
      await shopA.releaseAll();
      // A's are free; B's and the run's are held.
      await shopA.acquire(k('cart'), { ownerId: 'u9', expire: 30 });
      await shopA.acquire(k('anon'), { ownerId: 'u9', expire: 30 });
      await assert.rejects(shopB.acquire(k('cart'), { ownerId: 'u9' }), { message: `Failed to acquire lock for key "${k('cart')}"` });
      await assert.rejects(shopB.acquire(k('anon'), { ownerId: 'u9' }), { message: `Failed to acquire lock for key "${k('anon')}"` });
      await queued(c, job, 1);
      assert.equal(await exited, 0, `mlock run: ${stderr}`);
      for (const shop of [shopA, shopB]) await (registration(shop, 'locking-mlock') as { shutdown(): Promise<void> }).shutdown();
    } finally {
      c.destroy();
      await s.cleanup();
    }
  });
});

describe('locking-mlock: a queue wait through a connection drop', () => {
  test('acquire with awaitQueue keeps waiting in the queue when the connection drops at waitLockingTimeout', async () => {
    const s = await startServer();
    const px = await startProxy(s.port);
    const { MlockLockingProvider } = require(LOCKING_MLOCK);
    const holder = new MlockLockingProvider({}, { url: `mlock://${s.addr}` });
    const p = new MlockLockingProvider({}, { url: `mlock://${px.addr}`, waitLockingTimeout: 1 });
    const watcher = new Client(`mlock://${s.addr}`);
    const key = `qdrop-${process.pid}`;
    try {
      await holder.acquire(key, { ownerId: 'h', expire: 30 });
      let settled = '';
      const waiter = p.acquire(key, { ownerId: 'w', expire: 30, awaitQueue: true }).then(
        () => (settled = 'acquired'),
        (e: Error) => (settled = e.message),
      );
      await queued(watcher, `medusa_lock:${key}`, 2); // sent, and waiting behind the holder
      px.refuse(true);
      px.cut();
      await sleep(1500); // fixed: the outage, past waitLockingTimeout (the test's input)
      px.refuse(false);
      assert.equal(settled, '', 'the wait in the queue ended with the connection');
      assert.equal(await holder.release(key, { ownerId: 'h' }), true);
      await waiter;
      assert.equal(settled, 'acquired');
    } finally {
      watcher.destroy();
      await p.shutdown?.();
      await holder.shutdown?.();
      await px.close();
      await s.cleanup();
    }
  });
});

describe('a loss read with the grant', () => {
  /** A server that grants every lock and, in the same write, says it was evicted. */
  function evictingServer() {
    let n = 0;
    return fakeServer((sock, w) => {
      if (w[0] === 'connect') sock.write(encode('connected 1.0 new 15000'));
      else if (w[0] === 'lock') {
        const id = (++n).toString(16).padStart(32, '0');
        sock.write(Buffer.concat([encode(`result ${w[1]} success ${id}`), encode(`locked ${id} ${Date.now() + 30000} ${n}`), encode(`expired ${id} evicted`)]));
      } else if (w[0] === 'ping') sock.write(encode(`result ${w[1]} success pong`));
      else if (w.length > 1) sock.write(encode(`result ${w[1]} failed lock not exist!`));
    });
  }

  test("locking-mlock's execute and the client's execute do not run the job", async () => {
    const fake = await evictingServer();
    const { MlockLockingProvider } = require(LOCKING_MLOCK);
    const p = new MlockLockingProvider({}, { url: `mlock://127.0.0.1:${fake.port}` });
    const c = new Client({ host: '127.0.0.1', port: fake.port });
    try {
      let ran = 0;
      const e1 = await p.execute('evicted', async () => ran++).then(() => undefined, (e: unknown) => e);
      assert.ok(e1 instanceof MedusaError && /Lost the lock/.test(e1.message), `locking-mlock: ${e1}`);
      const e2 = await c.execute('evicted', async () => ran++).then(() => undefined, (e: unknown) => e);
      assert.ok(e2 instanceof MlockError && e2.type === 'lost', `client: ${e2}`);
      assert.equal(ran, 0, 'a job ran without its lock');
    } finally {
      c.destroy();
      await p.shutdown?.();
      fake.close();
    }
  });
});
