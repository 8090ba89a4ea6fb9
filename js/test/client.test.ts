// The mlock client against a real mlockd built from this repository: the
// seed README's scenarios, the original client's bugs as regression tests,
// and the extensions (tokens, loss, execute, owners, try-lock, signals).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as net from 'node:net';
import Client, { Lock, MlockError, parseURI } from 'mlock';
import { encode } from 'mlock/dist/framing';
import { resolve } from 'mlock/dist/options';
import { type Server, claimDir, claimPort, fakeServer, freePort, queued, sleep, startServer, until } from './helpers';

let srv: Server;
let uri: string;
before(async () => {
  srv = await startServer(['--session-grace', '3s', '--default-ttl', '1s']);
  uri = `mlock://${srv.addr}`;
});
after(async () => {
  await srv.cleanup();
});

let n = 0;
/** A resource name of its own for each use. */
const r = (name: string) => `${name}-${process.pid}-${++n}`;

/** k clients, each in a session of its own (its own socketId). */
function sessions(k: number, extra = ''): Client[] {
  return Array.from({ length: k }, () => new Client(`mlock://127.0.0.1:${srv.port}?socketId=t${process.pid}-${++n}${extra}`));
}

describe('the seed README', () => {
  test('quick start: lock one resource, unlock', async () => {
    const [c] = sessions(1);
    try {
      const res = r('resource-1');
      const lockId = await c.lock(res, 5000);
      assert.match(lockId, /^[0-9a-f]{32}$/);
      await c.unlock(lockId);
      // Free again: a try-lock gets it at once.
      const l = await c.tryLock(res);
      await l.unlock();
    } finally {
      c.destroy();
    }
  });

  test('scenario 1: all resources free, locked at once', async () => {
    const [c] = sessions(1);
    try {
      const id = await c.lock(`${r('res-a')}|${r('res-b')}|${r('res-c')}`);
      assert.ok(c.getLock(id)?.held);
      await c.unlock(id);
    } finally {
      c.destroy();
    }
  });

  test('scenario 2: a multi-resource request waits for a held one, granted on unlock', async () => {
    const [c1, c2] = sessions(2);
    try {
      const [a, b, cc] = [r('res-a'), r('res-b'), r('res-c')];
      const id1 = await c1.lock(a);
      let got = false;
      const p = c2.lock(`${a}|${b}|${cc}`).then((id) => ((got = true), id));
      await queued(c1, a, 2);
      assert.equal(got, false);
      // Meanwhile b and c are reserved: nobody barges in.
      await assert.rejects(c1.tryLock(b), (e: MlockError) => e.type === 'tolerate' && e.resource === b);
      await c1.unlock(id1);
      const id2 = await p;
      await c2.unlock(id2);
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('scenario 3: requests queue first come, first served', async () => {
    const [c1, c2, c3] = sessions(3);
    try {
      const [a, b] = [r('res-a'), r('res-b')];
      const order: string[] = [];
      const id1 = await c1.lock(a);
      const p2 = c2.lock(`${a}|${b}`).then((id) => (order.push('client2'), id));
      await queued(c1, a, 2);
      const p3 = c3.lock(`${a}|${b}`).then((id) => (order.push('client3'), id));
      await queued(c1, a, 3);
      await c1.unlock(id1);
      const id2 = await p2;
      await sleep(50);
      assert.deepEqual(order, ['client2']);
      await c2.unlock(id2);
      await c3.unlock(await p3);
      assert.deepEqual(order, ['client2', 'client3']);
    } finally {
      for (const c of [c1, c2, c3]) c.destroy();
    }
  });

  test('URI options equal the object options; ping, status', async () => {
    const a = resolve(`mlock://127.0.0.1:${srv.port}?timeout=5000&ttl=3000&prefix=order:`);
    const b = resolve({ host: '127.0.0.1', port: srv.port, timeout: 5000, ttl: 3000, prefix: 'order:' });
    assert.deepEqual(a, b);
    const c = new Client(`mlock://127.0.0.1:${srv.port}?timeout=5000&ttl=3000&prefix=order:`);
    try {
      assert.equal(await c.ping(), 'pong');
      const st = await c.status();
      assert.equal(typeof st.socketCount, 'number');
      assert.equal(typeof st.currentLocks, 'number');
      assert.equal(typeof st.liveTime, 'number');
      const l = await c.acquire('product:1001');
      assert.equal(l.resources, 'order:product:1001');
      assert.equal(l.ttl, 3000);
      await l.unlock();
    } finally {
      c.destroy();
    }
  });

  test('extend returns the new expiry, now + ttl', async () => {
    const [c] = sessions(1);
    try {
      const id = await c.lock(r('resource'), 5000);
      const before = Date.now();
      const exp = await c.extend(id, 20000);
      assert.ok(exp >= before + 20000 - 1000 && exp <= Date.now() + 20000 + 1000, `expiry ${exp - Date.now()} ms ahead`);
      await c.unlock(id);
    } finally {
      c.destroy();
    }
  });

  test('cron de-duplication: of two instances running a task, one runs it, the other skips', async () => {
    const [c1, c2] = sessions(2, '&prefix=task:');
    try {
      const task = r('daily-report');
      let runs = 0;
      const instance = async (c: Client) => {
        const l = await c.tryLock(task, { ttl: 60000 }).catch((e: MlockError) => {
          assert.equal(e.type, 'tolerate');
          return null;
        });
        if (!l) return 'skipped';
        try {
          runs++;
          await sleep(100);
          return 'ran';
        } finally {
          await l.unlock();
        }
      };
      const out = await Promise.all([instance(c1), instance(c2)]);
      assert.deepEqual(out.sort(), ['ran', 'skipped']);
      assert.equal(runs, 1);
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('connection pool: clients of one address share one session and connection', async () => {
    const c1 = new Client({ host: '127.0.0.1', port: srv.port });
    const c2 = new Client({ host: '127.0.0.1', port: srv.port });
    try {
      assert.equal(c1.socketId, c2.socketId);
      await Promise.all([c1.ping(), c2.ping()]);
      const st = await c1.status();
      const sockets = st.sockets as Record<string, unknown>;
      // Every test destroys its clients: this session is the only one of 127.0.0.1 now.
      assert.ok(Object.keys(sockets).length >= 1);
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('error types: request, tolerate, timeout, connection', async () => {
    const [c1, c2] = sessions(2);
    try {
      await assert.rejects(c1.lock('has space'), (e) => e instanceof MlockError && e.type === 'request');
      const a = r('tol');
      const id = await c1.lock(a);
      const waiting = c2.lock(a); // the queue: holder + 1 waiter
      await queued(c1, a, 2);
      await assert.rejects(c2.lock(a, 1000, 0, 1), (e: MlockError) => e.type === 'tolerate' && e.message === 'can not tolerate!');
      await assert.rejects(c2.lock(r('x') + '|' + a, 1000, 100), (e: MlockError) => e.type === 'timeout');
      await c1.unlock(id);
      await c2.unlock(await waiting);
      const port = await freePort();
      const dead = new Client({ host: '127.0.0.1', port, dialTimeout: 2000 });
      try {
        await assert.rejects(dead.ping(), (e: MlockError) => e.type === 'connection' && /unreachable/.test(e.message));
      } finally {
        dead.destroy();
      }
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });
});

describe("the original client's bugs", () => {
  test('a lock granted at once resolves: result and locked arrive in one read', async () => {
    const [c] = sessions(1);
    try {
      // Hundreds of grants in flight: results and pushes come batched.
      const ids = await Promise.all(Array.from({ length: 300 }, (_, i) => c.lock(`${r('batch')}-${i}`)));
      assert.equal(new Set(ids).size, 300);
      await Promise.all(ids.map((id) => c.unlock(id)));
    } finally {
      c.destroy();
    }
  });

  test('frames split anywhere and batched are decoded (header split, many in one chunk)', async () => {
    // A server that answers byte by byte, then everything in one chunk.
    const port = await freePort();
    const fake = net.createServer((s) => {
      let buf = Buffer.alloc(0);
      s.on('data', async (d) => {
        buf = Buffer.concat([buf, d]);
        while (buf.length >= 4 && buf.length >= buf.readInt32BE(0)) {
          const len = buf.readInt32BE(0);
          const text = buf.toString('utf8', 4, len - 1);
          buf = buf.subarray(len);
          const w = text.split(' ');
          if (w[0] === 'connect') {
            for (const byte of encode('connected 1.0 new 15000')) {
              s.write(Buffer.from([byte]));
              await sleep(1);
            }
          } else if (w[0] === 'lock') {
            s.write(Buffer.concat([encode(`result ${w[1]} success abc`), encode(`locked abc ${Date.now() + 5000} 7`)]));
          }
        }
      });
    });
    await new Promise<void>((res) => fake.listen(port, '127.0.0.1', () => res()));
    const c = new Client({ host: '127.0.0.1', port });
    try {
      const l = await c.acquire('x');
      assert.equal(l.id, 'abc');
      assert.equal(l.token, 7);
    } finally {
      c.destroy();
      fake.close();
    }
  });

  test('a lock without ttl gets the client default (60 s), not the server default: ttl is never sent as undefined', async () => {
    const [c] = sessions(1);
    try {
      const id = await c.lock(r('no-ttl'));
      const l = c.getLock(id)!;
      // This server's --default-ttl is 1 s: an empty ttl field would expire at once.
      assert.ok(l.expiresAt - Date.now() > 30000, `expires in ${l.expiresAt - Date.now()} ms`);
      await c.unlock(id);
    } finally {
      c.destroy();
    }
  });

  test('an error frame after connecting does not stop reconnection (session taken over, then taken back)', async () => {
    const c = new Client({ host: '127.0.0.1', port: srv.port, socketId: `takeover-${process.pid}` });
    try {
      await c.ping();
      let disconnects = 0;
      c.on('disconnect', () => disconnects++);
      // Another connection with the same socketId takes the session over:
      // the client's connection gets "error session taken over…" and is closed.
      const raw = net.connect({ host: '127.0.0.1', port: srv.port });
      await new Promise<void>((res) => raw.on('connect', () => res()));
      raw.write(encode(`connect takeover-${process.pid} 1.0`));
      await until(() => disconnects > 0, 5000, 'disconnect');
      raw.destroy();
      assert.equal(await c.ping(), 'pong');
    } finally {
      c.destroy();
    }
  });

  test('ping and status right after construction wait for the connection', async () => {
    const c = new Client(`mlock://127.0.0.1:${srv.port}?socketId=early-${process.pid}`);
    try {
      const [pong, st] = await Promise.all([c.ping(), c.status()]);
      assert.equal(pong, 'pong');
      assert.equal(typeof st.liveTime, 'number');
    } finally {
      c.destroy();
    }
  });

  test('destroy of one client does not close the connection the others share', async () => {
    const c1 = new Client({ host: '127.0.0.1', port: srv.port });
    const c2 = new Client({ host: '127.0.0.1', port: srv.port });
    try {
      // A lease of a minute: the 1.5 s below, the ping and a busy machine's
      // delays stay far inside it (with 2 s, a run whose ping came 1.1 s late
      // rightly believed the lock lost).
      const l = await c2.acquire(r('shared'), { ttl: 60000 });
      let disconnected = false;
      c2.on('disconnect', () => (disconnected = true));
      c1.destroy();
      await sleep(1500);
      assert.equal(disconnected, false);
      assert.equal(await c2.ping(), 'pong');
      assert.ok(l.held);
      await l.unlock();
    } finally {
      c2.destroy();
    }
  });

  test('destroy unlocks what the client holds and fails its waits', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('destroyed');
      const l = await c1.acquire(a);
      const w = c1.acquire(a);
      c1.destroy();
      await assert.rejects(w, (e: MlockError) => e.type === 'connection');
      assert.equal(l.held, false);
      assert.equal((await l.lost).type, 'lost');
      const l2 = await c2.acquire(a, { timeout: 2000 });
      await l2.unlock();
    } finally {
      c2.destroy();
    }
  });

  test('an expired lock is reported: lost event, lost promise, aborted signal', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('expires');
      const l = await c1.acquire(a, { ttl: 300 });
      let events = 0;
      l.on('lost', () => events++);
      let clientEvents = 0;
      c1.on('lost', (_e: MlockError, lock: Lock) => {
        if (lock === l) clientEvents++;
      });
      const e = await l.lost;
      assert.equal(e.type, 'lost');
      assert.equal(l.signal.aborted, true);
      assert.equal(events, 1);
      assert.equal(clientEvents, 1);
      assert.equal(l.held, false);
      await assert.rejects(l.extend(), (x: MlockError) => x.type === 'lost');
      const l2 = await c2.acquire(a, { timeout: 2000 });
      await l2.unlock();
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('options: port defaults to 12340, URI parameters can be 0, unknown parameters and bad prefixes are refused', () => {
    assert.equal(resolve({ host: 'example.test' }).addrs[0].port, 12340);
    const o = parseURI('mlock://h?timeout=0&tolerate=0&ttl=2s');
    assert.equal(o.timeout, 0);
    assert.equal(o.tolerate, 0);
    assert.equal(o.ttl, 2000);
    assert.deepEqual(parseURI('mlock://a:1,b,[::1]:3').addrs, ['a:1', 'b:12340', '[::1]:3']);
    assert.throws(() => parseURI('mlock://h?nope=1'), (e: MlockError) => e.type === 'request');
    assert.throws(() => new Client({ prefix: 'a|b' }), (e: MlockError) => e.type === 'request');
    assert.throws(() => parseURI('mlock://h/db'), (e: MlockError) => e.type === 'request');
  });

  test('a second socketId for an address in use is not silently ignored: it gets its own session', async () => {
    const c1 = new Client({ host: '127.0.0.1', port: srv.port, socketId: `sid1-${process.pid}` });
    const c2 = new Client({ host: '127.0.0.1', port: srv.port, socketId: `sid2-${process.pid}` });
    try {
      assert.equal(c2.socketId, `sid2-${process.pid}`);
      const a = r('sid');
      const l = await c1.acquire(a);
      await assert.rejects(c2.tryLock(a)); // another session: no re-entry by accident
      await l.unlock();
      // The same socketId under other credentials would take the session over: refused.
      assert.throws(() => new Client({ host: '127.0.0.1', port: srv.port, socketId: `sid1-${process.pid}`, name: 'x', token: 'y' }), (e: MlockError) => e.type === 'request');
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });
});

describe('extensions', () => {
  test('fencing tokens increase from grant to grant; extend keeps the token', async () => {
    const [c] = sessions(1);
    try {
      const a = r('fence');
      const l1 = await c.acquire(a);
      const t1 = l1.token;
      await l1.extend(5000);
      assert.equal(l1.token, t1);
      await l1.unlock();
      const l2 = await c.acquire(a);
      assert.ok(l2.token > t1);
      assert.ok(l2.deadline > Date.now() && l2.deadline <= Date.now() + l2.ttl);
      await l2.unlock();
    } finally {
      c.destroy();
    }
  });

  test('owners: re-entry renews the same lock, release and releaseAll are scoped, the holder learns of a release', async () => {
    const [c1, c2] = sessions(2);
    try {
      const [a, b] = [r('own-a'), r('own-b')];
      const l = await c1.acquire(a, { owner: 'w1', ttl: 5000 });
      const again = await c1.acquire(a, { owner: 'w1', ttl: 8000 });
      assert.equal(again, l);
      assert.equal(l.ttl, 8000);
      await assert.rejects(c2.tryLock(a, { owner: 'w2' }), (e: MlockError) => e.type === 'tolerate');
      await assert.rejects(c1.acquire(`${a}|${b}`, { owner: 'w1' }), (e: MlockError) => e.reason === 'owner holds an overlapping lock!');
      assert.equal(await c2.release('w2', a), false);
      const renewed = await c2.renew('w1', a, 9000);
      assert.equal(renewed.token, l.token);
      const lb = await c2.acquire(b, { owner: 'w1' });
      assert.equal(await c2.releaseAll('w1'), 2);
      assert.equal((await l.lost).reason, 'released');
      assert.equal((await lb.lost).reason, 'released');
      await assert.rejects(c2.renew('w1', a), (e: MlockError) => e.reason === 'lock not exist!');
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('anonymous owner "*" is recorded but never re-entrant', async () => {
    const [c] = sessions(1);
    try {
      const a = r('anon');
      const l = await c.acquire(a, { owner: '*' });
      await assert.rejects(c.tryLock(a, { owner: '*' }), (e: MlockError) => e.type === 'tolerate');
      assert.equal(await c.release('*', a), true);
      await l.lost;
    } finally {
      c.destroy();
    }
  });

  test('an AbortSignal gives up a wait, and the request leaves the queue', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('abort');
      const l = await c1.acquire(a);
      const ac = new AbortController();
      const w = c2.acquire(a, { signal: ac.signal });
      const w2 = c2.acquire(a, { timeout: 5000 });
      await sleep(50);
      ac.abort(new Error('enough'));
      await assert.rejects(w, (e: MlockError) => e.type === 'canceled' && (e.cause as Error).message === 'enough');
      await l.unlock();
      // The aborted request left the queue: the next one gets the lock.
      const l2 = await w2;
      await l2.unlock();
      await assert.rejects(c2.ping({ signal: AbortSignal.abort() }), (e: MlockError) => e.type === 'canceled');
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('a deadline gives up a wait at that time, and the request leaves the queue', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('deadline');
      const l = await c1.acquire(a);
      const t0 = Date.now();
      const w = c2.acquire(a, { deadline: t0 + 300 });
      const w2 = c2.acquire(a, { timeout: 5000 });
      await queued(c1, a, 3);
      await assert.rejects(w, (e: MlockError) => e.type === 'timeout' && e.reason === 'deadline');
      const took = Date.now() - t0;
      assert.ok(took >= 290 && took < 2000, `gave up after ${took} ms`);
      // The request given up left the queue: the holder and the next one remain.
      await queued(c1, a, 2);
      await l.unlock();
      const l2 = await w2;
      await l2.unlock();
      // A deadline already past fails at once, before anything is sent.
      await assert.rejects(c2.releaseAll('nobody', { deadline: Date.now() - 1 }), (e: MlockError) => e.type === 'timeout' && e.reason === 'deadline');
      // One not reached leaves the call alone.
      assert.equal(await c2.ping({ deadline: Date.now() + 5000 }), 'pong');
      const l3 = await c2.tryLock(a, { deadline: Date.now() + 5000 });
      await l3.unlock();
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('a deadline bounds the wait for a connection', async () => {
    // A listener that never answers the handshake: the connection wait lasts
    // until the dial timeout (60 s here) unless the deadline ends it.
    const conns = new Set<net.Socket>();
    const mute = net.createServer((s) => {
      conns.add(s);
      s.on('error', () => undefined);
    });
    await new Promise<void>((res) => mute.listen(0, '127.0.0.1', () => res()));
    const c = new Client({ host: '127.0.0.1', port: (mute.address() as net.AddressInfo).port, dialTimeout: 60000 });
    try {
      const t0 = Date.now();
      await assert.rejects(c.acquire(r('deadline-dial'), { deadline: t0 + 200 }), (e: MlockError) => e.type === 'timeout' && e.reason === 'deadline');
      await assert.rejects(c.release('o', r('deadline-dial'), { deadline: Date.now() + 100 }), (e: MlockError) => e.type === 'timeout' && e.reason === 'deadline');
      const took = Date.now() - t0;
      assert.ok(took >= 290 && took < 5000, `gave up after ${took} ms`);
    } finally {
      c.destroy();
      for (const s of conns) s.destroy();
      await new Promise<void>((res) => mute.close(() => res()));
    }
  });

  test('execute renews beyond the ttl, and unlocks at the end', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('exec');
      const result = await c1.execute(a, async (signal, lock) => {
        await sleep(2500); // two and a half ttls
        assert.equal(signal.aborted, false);
        await assert.rejects(c2.tryLock(a), (e: MlockError) => e.type === 'tolerate');
        return lock.token;
      }, { ttl: 1000 });
      assert.equal(typeof result, 'number');
      const l = await c2.tryLock(a);
      await l.unlock();
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('execute aborts the job when the lock is lost and throws the loss', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('exec-lost');
      let aborted = false;
      await assert.rejects(
        c1.execute(a, async (signal) => {
          await c2.releaseAll(`job-${n}`);
          if (!signal.aborted) await new Promise<void>((res) => signal.addEventListener('abort', () => res()));
          aborted = true;
          return 'finished anyway';
        }, { owner: `job-${n}`, ttl: 5000 }),
        (e: MlockError) => e.type === 'lost',
      );
      assert.equal(aborted, true);
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test("executes of one owner share its lock: the first to end does not unlock it under the other's job", async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('exec-owner');
      let bStarted!: () => void;
      const started = new Promise<void>((res) => (bStarted = res));
      const first = c1.execute(a, async () => {
        await started;
        return 'first';
      }, { owner: `w-${n}`, ttl: 5000 });
      const second = c1.execute(a, async (signal, lock) => {
        bStarted();
        assert.equal(await first, 'first');
        // The first execute has ended: the second still holds the lock.
        assert.equal(lock.held, true);
        assert.equal(signal.aborted, false);
        await assert.rejects(c2.tryLock(a), (e: MlockError) => e.type === 'tolerate');
        return 'second';
      }, { owner: `w-${n}`, ttl: 5000 });
      assert.equal(await second, 'second');
      await (await c2.tryLock(a)).unlock(); // unlocked once the last one ended
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('execute rethrows the job error and releases', async () => {
    const [c] = sessions(1);
    try {
      const a = r('exec-err');
      await assert.rejects(c.execute(a, () => Promise.reject(new Error('boom'))), /boom/);
      await (await c.tryLock(a)).unlock();
    } finally {
      c.destroy();
    }
  });

  test('a lock whose deadline passed while the event loop was blocked is not believed held', async () => {
    const [c] = sessions(1);
    try {
      const l = await c.acquire(r('blocked'), { ttl: 300 });
      const d = l.deadline;
      // A synchronous job past the deadline: no timer could run meanwhile.
      for (let i = 0; i < 1e9 && Date.now() <= d + 50; i++);
      assert.equal(l.held, false, 'believed held past its deadline');
      assert.equal(l.error?.type, 'lost');
      assert.equal(l.signal.aborted, true);
      // execute reports it for a job that blocked past the deadline.
      const a = r('blocked-exec');
      await assert.rejects(
        c.execute(a, (_s, lock) => {
          const end = lock.deadline;
          for (let i = 0; i < 1e9 && Date.now() <= end + 50; i++);
          return 1;
        }, { ttl: 300 }),
        (e: MlockError) => e.type === 'lost',
      );
    } finally {
      c.destroy();
    }
  });

  test('await using unlocks at the end of the block', async () => {
    const [c1, c2] = sessions(2);
    try {
      const a = r('using');
      {
        await using l = await c1.acquire(a);
        assert.ok(l.held);
        await assert.rejects(c2.tryLock(a));
      }
      const l2 = await c2.tryLock(a);
      await l2.unlock();
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });

  test('unlock twice: the handle resolves again; unlock(lockId) of an id no longer held here asks the server, as the original', async () => {
    const [c] = sessions(1);
    try {
      const res = r('twice');
      const id = await c.lock(res, 5000);
      const l = c.getLock(id)!;
      await c.unlock(id); // this process's lock: the handle's unlock
      assert.equal(l.held, false);
      await l.unlock(); // again: not an error
      await assert.rejects(c.unlock(id), (e: MlockError) => e.type === 'request' && e.reason === 'lock not exist!');
      const l2 = await c.acquire(res);
      await l2.unlock();
      await assert.rejects(c.unlock(l2.id), (e: MlockError) => e.type === 'request' && e.reason === 'lock not exist!');
      // A lost lock: the handle rejects with the loss, the id asks the server.
      const l3 = await c.acquire(res, { ttl: 100 });
      await l3.lost;
      await assert.rejects(l3.unlock(), (e: MlockError) => e.type === 'lost');
      await assert.rejects(c.unlock(l3.id), (e: MlockError) => e.type === 'request' && e.reason === 'lock not exist!');
    } finally {
      c.destroy();
    }
  });

  test('tryLock names the busy resource; unlock of an unknown id is a request error', async () => {
    const [c1, c2] = sessions(2);
    try {
      const [a, b] = [r('try-a'), r('try-b')];
      const l = await c1.acquire(b);
      await assert.rejects(c2.tryLock([a, b]), (e: MlockError) => e.type === 'tolerate' && e.resource === b && e.reason === 'resource is locked!');
      await l.unlock();
      await assert.rejects(c2.unlock('0123456789abcdef0123456789abcdef'), (e: MlockError) => e.type === 'request' && e.reason === 'lock not exist!');
    } finally {
      c1.destroy();
      c2.destroy();
    }
  });
});

describe('the test helpers', () => {
  test('a port another live test process claimed is not drawn; the claim of an exited one is taken over', async () => {
    const { spawnSync } = await import('node:child_process');
    const { readFileSync, writeFileSync } = await import('node:fs');
    const { join } = await import('node:path');
    const exited = spawnSync(process.execPath, ['-e', '']).pid;
    assert.ok(exited > 0);
    const port = await freePort(); // claimed by this process
    assert.equal(readFileSync(join(claimDir, String(port)), 'utf8'), String(process.pid));
    // Above the port range: no real claim is overwritten.
    const a = 65536 + Math.floor(Math.random() * 1e6);
    const b = a + 1;
    writeFileSync(join(claimDir, String(a)), String(process.ppid)); // the runner: alive
    writeFileSync(join(claimDir, String(b)), String(exited));
    assert.equal(claimPort(a), false);
    assert.equal(claimPort(b), true);
    assert.equal(readFileSync(join(claimDir, String(b)), 'utf8'), String(process.pid));
  });
});

describe('grants that cannot be confirmed', () => {
  test('a grant whose every confirmation comes back after its lease ended is not handed over: the wait times out', async () => {
    // Every answer 120 ms late, a ttl of 100 ms: no lease is left when one comes.
    let n = 0;
    const fake = await fakeServer((s, w) => {
      const later = (b: Buffer) => setTimeout(() => s.writable && s.write(b), 120);
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 15000'));
      else if (w[0] === 'lock') {
        const id = (++n).toString(16).padStart(32, '0');
        later(Buffer.concat([encode(`result ${w[1]} success ${id}`), encode(`locked ${id} ${Date.now() + 100} ${n}`)]));
      } else if (w[0] === 'extend') later(encode(`result ${w[1]} success ${Date.now() + 100}`));
      else if (w[0] === 'ping') later(encode(`result ${w[1]} success pong`));
      else if (w.length > 1) later(encode(`result ${w[1]} success done`));
    });
    const port = fake.port;
    const c = new Client({ host: '127.0.0.1', port });
    try {
      const got = await c.acquire('late', { ttl: 100, timeout: 1500 }).then(
        (l) => `resolved, held ${l.held}`,
        (e: MlockError) => e.type,
      );
      assert.equal(got, 'timeout');
    } finally {
      c.destroy();
      fake.close();
    }
  });
  test('a grant whose confirmations all come back too late to leave two thirds of its ttl is given back and asked again, never handed over short', async () => {
    // ttl 3 s. The process is busy for 1.2 s (more than a third of the ttl)
    // after the server wrote the first grant and after it wrote each answer
    // to a confirmation: each is read that much after its request was sent,
    // as from a paused process. Once the short grant is given back, every
    // answer is read at once.
    const ttl = 3000;
    const busy = () => {
      const until = Date.now() + 1200;
      while (Date.now() < until);
    };
    const id1 = '1'.repeat(32);
    const id2 = '2'.repeat(32);
    let prompt = false;
    let extends_ = 0;
    const unlocked: string[] = [];
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 600000'));
      else if (w[0] === 'lock') {
        const id = prompt ? id2 : id1;
        s.write(Buffer.concat([encode(`result ${w[1]} success ${id}`), encode(`locked ${id} ${Date.now() + ttl} ${prompt ? 2 : 1}`)]));
        if (!prompt) busy();
      } else if (w[0] === 'extend') {
        extends_++;
        s.write(encode(`result ${w[1]} success ${Date.now() + ttl}`));
        if (!prompt) busy();
      } else if (w[0] === 'unlock') {
        unlocked.push(w[2]);
        prompt = true;
        s.write(encode(`result ${w[1]} success 1`));
      } else if (w.length > 1) s.write(encode(`result ${w[1]} success pong`));
    });
    const c = new Client({ host: '127.0.0.1', port: fake.port });
    try {
      const l = await c.acquire('short', { ttl, timeout: 60000 });
      assert.equal(l.id, id2, 'handed over the grant whose confirmations all came back short');
      assert.deepEqual(unlocked, [id1]);
      assert.equal(extends_, 3, 'three confirmations of the first grant, none of the second');
      await l.unlock();
    } finally {
      c.destroy();
      fake.close();
    }
  });
});

describe('lock requests across a failed round of dials', () => {
  test('a lock request in flight when the connection drops keeps waiting across a failed round and is asked again once the server is back', async () => {
    // Connection 1 drops with the lock request unanswered; connection 2
    // fails its handshake (the round fails); connection 3 grants.
    const conns = new Map<net.Socket, number>();
    let lockSeen = false;
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') {
        conns.set(s, conns.size + 1);
        if (conns.get(s) === 2) s.destroy();
        else s.write(encode('connected 1.0 new 15000'));
      } else if (w[0] === 'lock' && conns.get(s) === 1) {
        lockSeen = true;
        s.destroy();
      } else if (w[0] === 'lock') {
        const id = 'a'.repeat(32);
        s.write(Buffer.concat([encode(`result ${w[1]} success ${id}`), encode(`locked ${id} ${Date.now() + 60000} 7`)]));
      } else if (w.length > 1) s.write(encode(`result ${w[1]} success pong`));
    });
    const c = new Client({ host: '127.0.0.1', port: fake.port, maxBackoff: 50 });
    try {
      await c.ping();
      const l = await c.acquire('in-flight', { ttl: 60000, timeout: 60000 });
      assert.ok(lockSeen);
      assert.equal(l.token, 7);
      assert.ok(conns.size >= 3, `${conns.size} connections: want a failed one between`);
    } finally {
      c.destroy();
      fake.close();
    }
  });
});

describe('answers read after a busy turn', () => {
  test("a pong that came while the process was busy past the ping's wait counts: the connection is kept", async () => {
    let pings = 0;
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 15000'));
      if (w[0] !== 'ping') return;
      s.write(encode(`result ${w[1]} success pong`));
      if (++pings === 2) {
        // The process is busy for longer than the ping's wait (1 s), with
        // the pong written: when it is free, the ping's timer is due before
        // the socket is read.
        const until = Date.now() + 1300;
        while (Date.now() < until);
      }
    });
    const port = fake.port;
    const c = new Client({ host: '127.0.0.1', port, pingInterval: 100 }); // its first ping is c.ping(), the second a keep-alive
    const drops: string[] = [];
    c.on('disconnect', (_node: string, err: Error) => drops.push(String(err?.message ?? err)));
    try {
      await c.ping();
      await until(() => pings >= 4, 10000, 'two pings after the busy one');
      assert.deepEqual(drops, []);
    } finally {
      c.destroy();
      fake.close();
    }
  });
});

describe('deadlines of the calls on a held lock', () => {
  test("extend and unlock of a lock this process holds keep the call's deadline", async () => {
    // A server that grants, then never answers.
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 15000'));
      else if (w[0] === 'lock') s.write(Buffer.concat([encode(`result ${w[1]} success ${'a'.repeat(32)}`), encode(`locked ${'a'.repeat(32)} ${Date.now() + 30000} 1`)]));
      else if (w[0] === 'ping') s.write(encode(`result ${w[1]} success pong`));
    });
    const port = fake.port;
    const c = new Client({ host: '127.0.0.1', port });
    try {
      const l = await c.acquire('quiet', { ttl: 30000 });
      for (const [what, call] of [
        ['client extend', () => c.extend(l.id, undefined, { deadline: Date.now() + 200 })],
        ['lock extend', () => l.extend(undefined, { deadline: Date.now() + 200 })],
        ['client unlock', () => c.unlock(l.id, { deadline: Date.now() + 200 })],
      ] as const) {
        const t0 = Date.now();
        const e = await (call() as Promise<unknown>).then(() => undefined, (err: unknown) => err);
        assert.ok(e instanceof MlockError && e.type === 'timeout', `${what}: ${e}`);
        assert.ok(Date.now() - t0 < 1500, `${what}: gave up after ${Date.now() - t0} ms`);
      }
    } finally {
      c.destroy();
      fake.close();
    }
  });
});

describe('an auth timeout or an eviction answered to a connect', () => {
  for (const text of ['auth timeout!', 'too many unauthenticated connections!']) {
    test(`${text} is no refusal: the client connects again and the call goes on`, async () => {
      let conns = 0;
      const fake = await fakeServer((s, w) => {
        if (w[0] === 'connect' && ++conns === 1) s.end(encode(`error ${text}`));
        else if (w[0] === 'connect') s.write(encode('connected 1.0 new 60000'));
        else if (w[0] === 'ping') s.write(encode(`result ${w[1]} success pong`));
      });
      const port = fake.port;
      const c = new Client({ host: '127.0.0.1', port });
      try {
        const t0 = Date.now();
        assert.equal(await c.ping(), 'pong');
        assert.ok(Date.now() - t0 < 2000, `connected again after ${Date.now() - t0} ms`);
      } finally {
        c.destroy();
        fake.close();
      }
    });
  }
});
