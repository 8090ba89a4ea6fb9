// The client through cut and silent connections (a TCP proxy), server
// restarts, session resume, and failover between the nodes of a cluster.
import { after, before, describe, test } from 'node:test';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import Client, { type MlockError } from 'mlock';
import { type Proxy, type Server, queued, sleep, startCluster, startProxy, startServer, until } from './helpers';

let n = 0;
const r = (name: string) => `${name}-${process.pid}-${++n}`;

describe('a cut connection', () => {
  let srv: Server;
  let proxy: Proxy;
  before(async () => {
    srv = await startServer(['--session-grace', '5s']);
    proxy = await startProxy(srv.port);
  });
  after(async () => {
    await proxy.close();
    await srv.cleanup();
  });

  test('the session resumes: a held lock stays held, a waiting one is granted after the reconnect', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `cut-${process.pid}` });
    const other = new Client({ host: '127.0.0.1', port: srv.port, socketId: `direct-${process.pid}` });
    try {
      const [a, b] = [r('held'), r('wait')];
      const held = await c.acquire(a, { ttl: 5000 });
      const blocker = await other.acquire(b);
      const waiting = c.acquire(b, { ttl: 5000 });
      await queued(other, b, 2);
      let reconnects = 0;
      c.on('reconnect', (_node: string, resumed: boolean) => {
        assert.equal(resumed, true);
        reconnects++;
      });
      proxy.cut();
      // Granted while the connection is down: the push waits for the session.
      await blocker.unlock();
      const l = await waiting;
      assert.ok(l.held);
      assert.ok(reconnects >= 1);
      assert.ok(held.held, 'the held lock survived the cut');
      await held.extend(5000);
      await assert.rejects(other.tryLock(a));
      await l.unlock();
      await held.unlock();
    } finally {
      c.destroy();
      other.destroy();
    }
  });

  test('reconnects after every cut, with no retry budget to run out', async () => {
    // A cut right after a connect is an unstable connection: the backoff
    // grows; its cap keeps the 12 rounds short, the budget is what is tested.
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `cuts-${process.pid}`, maxBackoff: 100 });
    try {
      for (let i = 0; i < 12; i++) {
        assert.equal(await c.ping(), 'pong');
        proxy.cut();
      }
      assert.equal(await c.ping(), 'pong');
    } finally {
      c.destroy();
    }
  });

  test('a call in flight fails with a connection error when the connection breaks, instead of hanging', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `inflight-${process.pid}` });
    try {
      await c.ping();
      proxy.blackhole(true);
      const p = c.release('someone', r('x')); // not retried: it may have been applied
      await sleep(50);
      proxy.cut();
      proxy.blackhole(false);
      await assert.rejects(p, (e: MlockError) => e.type === 'connection');
      assert.equal(await c.ping(), 'pong');
    } finally {
      proxy.blackhole(false);
      c.destroy();
    }
  });

  test('a silent peer is detected by the keep-alive and the client reconnects', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `silent-${process.pid}`, pingInterval: 200 });
    try {
      await c.ping();
      let lost = 0;
      c.on('disconnect', () => lost++);
      proxy.blackhole(true);
      await until(() => lost > 0, 10000, 'the dead connection to be noticed');
      proxy.blackhole(false);
      assert.equal(await c.ping(), 'pong');
    } finally {
      proxy.blackhole(false);
      c.destroy();
    }
  });

  test('a held lock is given up at its deadline when the server stays silent', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `deadline-${process.pid}`, pingInterval: 60000 });
    try {
      const sent = Date.now();
      const l = await c.acquire(r('silent'), { ttl: 600 });
      // The deadline the client believes in never lies past the lease it can
      // justify: the send time of the request plus the ttl, less the margin.
      const deadline = l.deadline;
      assert.ok(deadline <= Date.now() + 600 - 11 && deadline >= sent, `deadline ${deadline - sent} ms after the send`);
      proxy.blackhole(true);
      proxy.refuse(true);
      const e = await l.lost;
      assert.equal(e.type, 'lost');
      assert.match(e.message, /without word from the server/);
      assert.ok(Date.now() >= deadline - 2, 'not lost before its deadline');
    } finally {
      proxy.blackhole(false);
      proxy.refuse(false);
      c.destroy();
    }
  });
});

describe('a server restart', () => {
  test('held locks are lost (session lost), waiting requests are asked again on the new server', async () => {
    const srv = await startServer(['--session-grace', '5s', '--shutdown-wait', '0']);
    const c = new Client({ host: '127.0.0.1', port: srv.port, socketId: `restart-${process.pid}`, maxBackoff: 200 });
    const c2 = new Client({ host: '127.0.0.1', port: srv.port, socketId: `restart2-${process.pid}`, maxBackoff: 200 });
    try {
      const a = r('restart');
      const held = await c2.acquire(a);
      const waiting = c.acquire(a, { timeout: 20000 });
      await queued(c2, a, 2);
      await srv.kill();
      await srv.start();
      const e = await held.lost;
      assert.equal(e.type, 'lost');
      assert.equal(e.reason, 'session lost');
      const l = await waiting;
      assert.ok(l.held);
      assert.ok(l.token > held.token, 'tokens keep increasing across restarts');
      await l.unlock();
    } finally {
      c.destroy();
      c2.destroy();
      await srv.cleanup();
    }
  });

  test('a clean shutdown: held locks are lost at once and the client reconnects to the restarted server', async () => {
    const srv = await startServer(['--session-grace', '5s']);
    const c = new Client({ host: '127.0.0.1', port: srv.port, socketId: `shutdown-${process.pid}`, maxBackoff: 200 });
    try {
      const l = await c.acquire(r('shutdown'));
      const stopped = srv.stop();
      const e = await l.lost;
      assert.equal(e.type, 'lost');
      await stopped;
      await srv.start();
      assert.equal(await c.ping(), 'pong');
    } finally {
      c.destroy();
      await srv.cleanup();
    }
  });
});

describe('a cluster of three nodes', () => {
  test('the session fails over to the next node: the lock stays held, the queue keeps its order', async (t) => {
    let cl: Awaited<ReturnType<typeof startCluster>>;
    try {
      cl = await startCluster();
    } catch (e) {
      t.skip(`cluster did not start: ${(e as Error).message}`);
      return;
    }
    const c = new Client(`${cl.uri}?socketId=fo-${process.pid}`);
    const c2 = new Client(`${cl.uri}?socketId=fo2-${process.pid}`);
    try {
      const a = r('failover');
      // The first lock waits for the cluster's first leader.
      const l = await c.acquire(a, { ttl: 15000, signal: AbortSignal.timeout(20000) });
      const first = c.node;
      assert.ok(first);
      const waiting = c2.acquire(a, { ttl: 15000 });
      await queued(c2, a, 2);
      const victim = cl.nodes.find((x) => x.addr === first)!;
      await victim.kill();
      await until(() => c.node !== '' && c.node !== first, 20000, 'the client to move to another node');
      await l.extend(15000, { signal: AbortSignal.timeout(20000) });
      assert.ok(l.held, 'the lock is still held after the failover');
      await l.unlock({ signal: AbortSignal.timeout(20000) });
      const l2 = await waiting;
      assert.ok(l2.token > l.token);
      await l2.unlock({ signal: AbortSignal.timeout(20000) });
    } finally {
      c.destroy();
      c2.destroy();
      await cl.cleanup();
    }
  });
});

describe('credentials', () => {
  test('auth=name:token: a principal locks under its prefixes only; a wrong token is refused at once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mlock-auth-'));
    const token = randomBytes(24).toString('base64url');
    const file = join(dir, 'mlockd.auth');
    writeFileSync(file, `jsuser sha256:${createHash('sha256').update(token).digest('hex')} prefix=job:\n`, { mode: 0o600 });
    const srv = await startServer(['--auth-file', file]);
    const c = new Client(`mlock://jsuser:${token}@127.0.0.1:${srv.port}`);
    const bad = new Client({ host: '127.0.0.1', port: srv.port, name: 'jsuser', token: 'wrong', dialTimeout: 10000 });
    try {
      const l = await c.acquire(r('job:x'));
      await l.unlock();
      await assert.rejects(c.acquire(r('other:x')), (e: MlockError) => e.type === 'request' && e.reason === 'permission denied!');
      const t0 = Date.now();
      await assert.rejects(bad.ping(), (e: MlockError) => e.type === 'connection' && e.reason === 'authentication failed!');
      assert.ok(Date.now() - t0 < 5000, 'a refusal is reported without waiting for the dial timeout');
    } finally {
      c.destroy();
      bad.destroy();
      await srv.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('TLS', () => {
  test('mlocks:// with tls-ca talks to a TLS listener; a plain client is told TLS is required; an unknown CA is refused', async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'mlock-tls-'));
    const f = (name: string) => join(dir, name);
    try {
      const ssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
      ssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '1', '-subj', '/CN=mlock test CA');
      ssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f('srv.key'), '-out', f('srv.csr'), '-subj', '/CN=127.0.0.1');
      writeFileSync(f('ext'), 'subjectAltName=IP:127.0.0.1\n');
      ssl('x509', '-req', '-in', f('srv.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial', '-out', f('srv.pem'), '-days', '1', '-extfile', f('ext'));
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      t.skip(`openssl could not make a certificate: ${(e as Error).message}`);
      return;
    }
    const srv = await startServer(['--tls-cert', f('srv.pem'), '--tls-key', f('srv.key')]);
    const c = new Client(`mlocks://127.0.0.1:${srv.port}?tls-ca=${encodeURIComponent(f('ca.pem'))}`);
    const plain = new Client({ host: '127.0.0.1', port: srv.port, dialTimeout: 10000 });
    const untrusted = new Client({ uri: `mlocks://127.0.0.1:${srv.port}`, dialTimeout: 1500 });
    try {
      const l = await c.acquire(r('tls'));
      assert.ok(l.token > 0);
      await l.unlock();
      await assert.rejects(plain.ping(), (e: MlockError) => e.type === 'connection' && e.reason === 'TLS required!');
      await assert.rejects(untrusted.ping(), (e: MlockError) => e.type === 'connection' && /certificate/i.test(e.message));
    } finally {
      c.destroy();
      plain.destroy();
      untrusted.destroy();
      await srv.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
