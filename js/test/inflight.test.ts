// The client's calls in flight across faults: lock requests asked again,
// answers lost on the way, grants after long waits, servers that drop or
// stall connections, the move to the leader, and the process kept alive by
// a call. (Cut connections, restarts, failover, credentials and TLS are in
// resilience.test.ts.)
import { after, afterEach, before, describe, mock, test } from 'node:test';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import assert from 'node:assert/strict';
import * as net from 'node:net';
import Client, { type Lock, type MlockError } from 'mlock';
import { encode } from 'mlock/dist/framing';
import { type Proxy, type Server, fakeServer, freePort, queued, sleep, startProxy, startServer, until } from './helpers';

let n = 0;
const r = (name: string) => `${name}-${process.pid}-${++n}`;

/** p, or a failure after ms: a request neither answered nor failed. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: neither answered nor failed within ${ms} ms`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

describe('lock requests asked again', () => {
  let srv: Server;
  let proxy: Proxy;
  let other: Client;
  before(async () => {
    // Status is polled to see the server's queues: no rate limit.
    srv = await startServer(['--session-grace', '5s', '--status-rate', '-1']);
    proxy = await startProxy(srv.port);
    other = new Client({ host: '127.0.0.1', port: srv.port, socketId: `again-other-${process.pid}` });
  });
  after(async () => {
    other.destroy();
    await proxy.close();
    await srv.cleanup();
  });

  /** The holder believes it holds a: nobody else gets it; after its unlock, others do. */
  async function holdsExactly(l: { held: boolean; unlock(): Promise<void> }, a: string): Promise<void> {
    assert.ok(l.held, 'the lock returned is held');
    await queued(other, a, 1);
    await assert.rejects(other.tryLock(a), (e: MlockError) => e.reason === 'resource is locked!', 'another client got the lock its holder believes it holds');
    await l.unlock();
    await queued(other, a, 0);
    const t = await other.tryLock(a);
    await t.unlock();
  }

  for (const owner of [undefined, 'worker-1']) {
    test(`a lock request whose connection drops before its answer is asked again (owner ${owner ?? 'none'})`, async () => {
      const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `inflight-again-${owner ?? ''}-${process.pid}`, maxBackoff: 50, dialTimeout: 500 });
      try {
        await c.ping();
        const a = r('inflight');
        proxy.dropBack(true); // the answers are lost
        const g = c.acquire(a, { ttl: 10000, timeout: 5000, owner });
        await queued(other, a, 1); // granted on the server
        proxy.cut();
        proxy.dropBack(false);
        const l = await within(g, 5000, 'the lock request in flight');
        assert.ok(l.deadline > 0);
        // The first grant is given back; only the one answered is held.
        await holdsExactly(l, a);
      } finally {
        proxy.dropBack(false);
        c.destroy();
      }
    });
  }

  test('a try-lock in flight fails with a connection error when a whole round of dials fails (a lock keeps waiting: client.test.ts)', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `inflight-round-${process.pid}`, maxBackoff: 50, dialTimeout: 500 });
    try {
      await c.ping();
      const a = r('round');
      proxy.dropBack(true);
      const g = c.tryLock(a, { ttl: 10000 });
      await queued(other, a, 1);
      proxy.refuse(true);
      proxy.cut();
      await assert.rejects(within(g, 5000, 'the lock request in flight'), (e: MlockError) => e.type === 'connection');
    } finally {
      proxy.dropBack(false);
      proxy.refuse(false);
      c.destroy();
    }
  });

  test('a request waiting to be asked again: abandoned through its signal, failed by a destroyed client', async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `inflight-end-${process.pid}`, maxBackoff: 50, dialTimeout: 2000 });
    try {
      await c.ping();
      const [a, b] = [r('abandoned'), r('destroyed')];
      let lost = 0;
      c.on('disconnect', () => lost++);
      proxy.dropBack(true);
      const ac = new AbortController();
      const ga = c.acquire(a, { ttl: 10000, signal: ac.signal });
      const gb = c.acquire(b, { ttl: 10000 });
      await queued(other, a, 1);
      await queued(other, b, 1);
      // The next connection is accepted but never answered: both wait to be asked again.
      proxy.blackhole(true);
      proxy.cut();
      proxy.dropBack(false);
      await until(() => lost > 0, 5000, 'the cut to be noticed');
      ac.abort();
      await assert.rejects(ga, (e: MlockError) => e.type === 'canceled');
      c.destroy();
      await assert.rejects(within(gb, 1000, 'the request of a destroyed client'), (e: MlockError) => e.type === 'connection' && e.reason === 'destroyed');
    } finally {
      proxy.dropBack(false);
      proxy.blackhole(false);
      c.destroy();
    }
  });

  test("an owner's request renewing, by re-entry, a grant given back (its request was abandoned) is asked again", async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `reentry-${process.pid}` });
    let resume: (() => void) | undefined;
    try {
      await c.ping();
      const a = r('reentry');
      const o = { ttl: 10000, owner: 'job' };
      resume = proxy.pause();
      const ac = new AbortController();
      const first = c.acquire(a, { ...o, signal: ac.signal });
      await queued(other, a, 1); // granted on the server, the answer held back
      ac.abort();
      await assert.rejects(first, (e: MlockError) => e.type === 'canceled');
      const second = c.acquire(a, o); // renews the first grant by re-entry
      await sleep(100);
      resume();
      const l = await within(second, 5000, 'the second request');
      await holdsExactly(l, a);
    } finally {
      resume?.();
      c.destroy();
    }
  });

  test("an owner's lock answered while its unlock of the same lock is in flight is asked again", async () => {
    const c = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `during-unlock-${process.pid}` });
    let resume: (() => void) | undefined;
    try {
      const a = r('during-unlock');
      const o = { ttl: 10000, owner: 'job' };
      const first = await c.acquire(a, o);
      resume = proxy.pause();
      const second = c.acquire(a, o); // sent first: renews the first lock
      await sleep(50);
      const unlocked = first.unlock(); // then unlocks it
      await sleep(50);
      resume();
      await unlocked;
      const l = await within(second, 5000, 'the second request');
      assert.notEqual(l, first, 'the handle being unlocked was returned');
      assert.equal(l.error, undefined);
      await holdsExactly(l, a);
    } finally {
      resume?.();
      c.destroy();
    }
  });
});

describe('the session end counts from successes only', () => {
  test('a refusal and a status answer do not move a held lock deadline; a ping does', async () => {
    // A long lease and a 10 s grace: the deadline is bound by the session,
    // and keep-alive pings come every 3.3 s of silence.
    const srv = await startServer(['--session-grace', '10s']);
    const c = new Client({ host: '127.0.0.1', port: srv.port, socketId: `acks-${process.pid}` });
    try {
      const l = await c.acquire(r('acks'), { ttl: 60000 });
      const d0 = l.deadline;
      await sleep(300);
      await assert.rejects(c.extend('0'.repeat(32), 1000), (e: MlockError) => e.reason === 'lock not exist!');
      await c.status();
      const d1 = l.deadline;
      assert.ok(d1 - d0 < 100, `the deadline moved ${d1 - d0} ms on a refusal and a status answer`);
      await c.ping();
      const d2 = l.deadline;
      assert.ok(d2 - d0 >= 250, `the deadline moved only ${d2 - d0} ms on a ping answered 300 ms later`);
      await l.unlock();
    } finally {
      c.destroy();
      await srv.cleanup();
    }
  });
});

// A fake cluster node: answers connect with `connected 1.0 <mode> 15000`
// plus, when asked with want=leader, ` leader=<named>`, and every ping with
// pong. It records the connect frames it read.
async function fakeNode(
  mode: 'new' | 'resumed',
  named?: () => string,
  dropAfterConnect = false,
): Promise<{ port: number; addr: string; connects: string[]; close(): void }> {
  const connects: string[] = [];
  const srv = await fakeServer((s, w) => {
    if (w[0] === 'connect') {
      connects.push(w.join(' '));
      const leader = named && w.includes('want=leader') ? ` leader=${named()}` : '';
      s.write(encode(`connected 1.0 ${mode} 15000${leader}`));
      if (dropAfterConnect) s.destroy();
    } else if (w[0] === 'ping') {
      s.write(encode(`result ${w[1]} success pong`));
    }
  });
  return { ...srv, connects };
}

describe('a server that drops every connection after its handshake', () => {
  test('is dialled again with a growing backoff, not at once (a few times in a second, not thousands)', async () => {
    const node = await fakeNode('new', undefined, true);
    const c = new Client({ host: '127.0.0.1', port: node.port, socketId: `storm-${process.pid}` });
    try {
      await c.ping({ signal: AbortSignal.timeout(1000) }).catch(() => {});
      await sleep(1000);
      // About 2 s: backoffs of 50, 100, 200, 400, 800 ms (each jittered
      // to at least half) allow at most 7 connections; reconnecting at
      // once gives thousands.
      assert.ok(node.connects.length >= 2, `${node.connects.length} connections: the client did not reconnect`);
      assert.ok(node.connects.length <= 15, `${node.connects.length} connections in about a second`);
    } finally {
      c.destroy();
      node.close();
    }
  });
});

describe('the move to the leader', () => {
  test('a new session on a follower moves to the leader it names, once; the leader is not asked', async () => {
    const leader = await fakeNode('new', () => 'should-not-be-asked:1');
    const follower = await fakeNode('new', () => leader.addr.toUpperCase());
    const c = new Client({ addrs: [follower.addr, leader.addr] });
    try {
      await c.ping({ signal: AbortSignal.timeout(5000) });
      assert.equal(c.node, leader.addr);
      assert.equal(follower.connects.length, 1);
      assert.match(follower.connects[0], / want=leader$/);
      assert.equal(leader.connects.length, 1);
      assert.doesNotMatch(leader.connects[0], /want=leader/);
    } finally {
      c.destroy();
      leader.close();
      follower.close();
    }
  });

  test('it stays: stay-on-node=1, a leader not among its addresses, a resumed session, a single address', async () => {
    const leader = await fakeNode('new');
    const follower = await fakeNode('new', () => leader.addr);
    const stranger = await fakeNode('new', () => '127.0.0.1:1');
    const resumed = await fakeNode('resumed', () => leader.addr);
    const cases: [string, Client, { connects: string[] }, boolean][] = [
      ['stay-on-node', new Client(`mlock://${follower.addr},${leader.addr}?stay-on-node=1&socketId=s1-${process.pid}`), follower, false],
      ['unknown leader', new Client({ addrs: [stranger.addr, leader.addr], socketId: `s2-${process.pid}` }), stranger, true],
      ['resumed', new Client({ addrs: [resumed.addr, leader.addr], socketId: `s3-${process.pid}` }), resumed, true],
    ];
    try {
      for (const [name, c, node, asked] of cases) {
        await c.ping({ signal: AbortSignal.timeout(5000) });
        assert.notEqual(c.node, leader.addr, name);
        assert.equal(node.connects.length, 1, name);
        assert.equal(node.connects[0].endsWith(' want=leader'), asked, name);
      }
      assert.equal(leader.connects.length, 0);
      const single = new Client({ host: '127.0.0.1', port: follower.port, socketId: `s4-${process.pid}` });
      try {
        await single.ping({ signal: AbortSignal.timeout(5000) });
        assert.doesNotMatch(follower.connects[1], /want=leader/);
      } finally {
        single.destroy();
      }
    } finally {
      for (const [, c] of cases) c.destroy();
      for (const x of [leader, follower, stranger, resumed]) x.close();
    }
  });

  test('a leader that does not answer: back to the follower, to stay', async () => {
    const deadPort = await freePort(); // nothing listens there
    const follower = await fakeNode('new', () => `127.0.0.1:${deadPort}`);
    const c = new Client({ addrs: [follower.addr, `127.0.0.1:${deadPort}`] });
    try {
      await c.ping({ signal: AbortSignal.timeout(5000) });
      assert.equal(c.node, follower.addr);
      assert.equal(follower.connects.length, 2);
      assert.match(follower.connects[0], / want=leader$/);
      assert.doesNotMatch(follower.connects[1], /want=leader/);
    } finally {
      c.destroy();
      follower.close();
    }
  });
});

describe('answers lost on the way', () => {
  let srv: Server;
  let proxy: Proxy;
  let other: Client;
  before(async () => {
    srv = await startServer(['--session-grace', '5s']);
    proxy = await startProxy(srv.port);
    other = new Client({ host: '127.0.0.1', port: srv.port, socketId: `lost-other-${process.pid}` });
  });
  after(async () => {
    other.destroy();
    await proxy.close();
    await srv.cleanup();
  });
  const client = (name: string, o: Record<string, unknown> = {}) =>
    new Client({ host: '127.0.0.1', port: proxy.port, socketId: `${name}-${process.pid}-${++n}`, pingInterval: 60000, ...o });
  /** Waits until another session can take name (the server freed it), and gives it back. */
  const freed = (name: string) =>
    until(
      async () => {
        try {
          await (await other.tryLock(name)).unlock();
          return true;
        } catch {
          return false;
        }
      },
      15000,
      `${name} to be free`,
    );

  test('a shorter extend bounds the deadline from its send, even when its answer never arrives', async () => {
    const c = client('short-extend');
    try {
      const name = r('short-extend');
      const l = await c.acquire(name, { ttl: 60000 });
      proxy.dropBack(true);
      const ac = new AbortController();
      const before = Date.now();
      const p = l.extend(400, { signal: ac.signal });
      assert.ok(l.deadline <= Date.now() + 400, `deadline ${l.deadline - before} ms ahead after a 400 ms extend was sent`);
      await sleep(50);
      ac.abort();
      await assert.rejects(p, (e: MlockError) => e.type === 'canceled');
      // The server may have applied it: the holder never believes past it.
      assert.ok(l.deadline <= before + 400 + 50, `deadline ${l.deadline - before} ms after the send of a 400 ms extend`);
      await freed(name); // it was applied
      await until(() => !l.held, 5000, 'the holder to give the lock up');
    } finally {
      proxy.dropBack(false);
      c.destroy();
    }
  });

  test("an owner's shorter re-entry bounds the held lock's deadline; an abandoned one does not give the held lock back", async () => {
    const c = client('short-reentry');
    try {
      const name = r('short-reentry');
      const l = await c.acquire(name, { ttl: 60000, owner: 'o1' });
      // Abandoned at once, answered: the held lock stays held, on the server too.
      const ac = new AbortController();
      const p = c.acquire(name, { ttl: 60000, owner: 'o1', signal: ac.signal });
      ac.abort();
      await assert.rejects(p, (e: MlockError) => e.type === 'canceled');
      await c.ping();
      await c.ping();
      assert.ok(l.held);
      await assert.rejects(other.tryLock(name), (e: MlockError) => e.type === 'tolerate', 'the lock its holder believes held is taken by another session');
      // A shorter re-entry whose answer is lost: the deadline is bounded from its send.
      proxy.dropBack(true);
      const ac2 = new AbortController();
      const before = Date.now();
      const p2 = c.acquire(name, { ttl: 400, owner: 'o1', signal: ac2.signal });
      await sleep(50);
      ac2.abort();
      await assert.rejects(p2, (e: MlockError) => e.type === 'canceled');
      assert.ok(l.deadline <= before + 400 + 50, `deadline ${l.deadline - before} ms after the send of a 400 ms re-entry`);
      await freed(name);
      await until(() => !l.held, 5000, 'the holder to give the lock up');
    } finally {
      proxy.dropBack(false);
      c.destroy();
    }
  });

  test('a refused shorter renewal does not bound the deadline; an answered later one lifts the bound', async () => {
    // A server that grants every lock and refuses every extend (its answer: not applied).
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 60000'));
      else if (w[0] === 'lock') {
        const id = randomBytes(16).toString('hex');
        s.write(encode(`result ${w[1]} success ${id}`));
        s.write(encode(`locked ${id} ${Date.now() + Number(w[3])} 1`));
      } else if (w[0] === 'extend') s.write(encode(`result ${w[1]} failed can not tolerate!`));
      else s.write(encode(`result ${w[1]} success pong`));
    });
    const c = new Client({ host: '127.0.0.1', port: fake.port, socketId: `short-refused-${process.pid}`, pingInterval: 60000 });
    try {
      const l = await c.acquire(r('short-refused'), { ttl: 60000 });
      await assert.rejects(l.extend(400), (e: MlockError) => e.reason === 'can not tolerate!');
      assert.ok(l.deadline > Date.now() + 30000, 'a refused extend bounds the deadline');
    } finally {
      c.destroy();
      fake.close();
    }
    const c2 = client('short-lifted');
    try {
      const name = r('short-lifted');
      const l = await c2.acquire(name, { ttl: 60000, owner: 'o2' });
      await c2.renew('o2', name, 400);
      assert.ok(l.deadline <= Date.now() + 400);
      await l.extend(60000);
      assert.ok(l.deadline > Date.now() + 3000, 'an answered longer extend lifts the bound');
      await l.unlock();
    } finally {
      c2.destroy();
    }
  });

  test('a release by owner whose answer is lost loses the held handles it may have freed', async () => {
    const c = client('release-lost');
    try {
      const [a, b] = [r('rel-a'), r('rel-b')];
      const la = await c.acquire(a, { owner: 'o3' });
      const lb = await c.acquire(b, { owner: 'o3' });
      const lc = await c.acquire(r('rel-c'), { owner: 'o4' });
      proxy.dropBack(true);
      const p = c.release('o3', a);
      await freed(a); // applied
      proxy.cut();
      proxy.dropBack(false);
      await assert.rejects(p, (e: MlockError) => e.type === 'connection');
      assert.equal(la.held, false, 'released on the server, believed held');
      assert.equal(la.error?.type, 'lost');
      assert.ok(lb.held && lc.held, 'other resources and owners are untouched');
      await c.ping(); // connected again
      proxy.dropBack(true);
      const ac = new AbortController();
      const p2 = c.releaseAll('o3', { signal: ac.signal });
      await freed(b);
      ac.abort();
      await assert.rejects(p2, (e: MlockError) => e.type === 'canceled');
      assert.equal(lb.held, false, 'released on the server, believed held');
      assert.ok(lc.held);
      proxy.dropBack(false);
      await lc.unlock();
    } finally {
      proxy.dropBack(false);
      c.destroy();
    }
  });

  test('an unlock asked again after its answer was lost succeeds when the first one freed the lock', async () => {
    const c = client('unlock-lost');
    try {
      const name = r('unlock-lost');
      const l = await c.acquire(name, { ttl: 60000 });
      proxy.dropBack(true);
      const p = l.unlock();
      await freed(name);
      proxy.cut();
      proxy.dropBack(false);
      await p;
      assert.equal(l.held, false);
      assert.equal(l.error, undefined);
    } finally {
      proxy.dropBack(false);
      c.destroy();
    }
  });

  test('an extend answered after its lock was lost reports the loss', async () => {
    const c = client('extend-late');
    try {
      const l = await c.acquire(r('extend-late'), { ttl: 500 });
      const resume = proxy.pause();
      const p = l.extend(60000);
      await l.lost;
      resume();
      await assert.rejects(p, (e: MlockError) => e.type === 'lost');
      assert.equal(l.held, false);
    } finally {
      c.destroy();
    }
  });

  test("a destroyed client's calls waiting for the connection or in flight fail at once; nothing of it is granted later", async () => {
    const sid = `destroy-${process.pid}-${++n}`;
    const c1 = new Client({ host: '127.0.0.1', port: proxy.port, socketId: sid, dialTimeout: 30000, maxBackoff: 100 });
    const c2 = new Client({ host: '127.0.0.1', port: proxy.port, socketId: sid });
    try {
      const name = r('destroy');
      await c1.ping();
      // In flight: never answered.
      proxy.blackhole(true);
      const ping = c1.ping();
      await sleep(50);
      const down = new Promise<void>((res) => c2.once('disconnect', () => res()));
      proxy.refuse(true);
      proxy.cut();
      proxy.blackhole(false);
      await down;
      // Waiting for the connection.
      const waiting = c1.acquire(name);
      const pinging = c1.ping();
      const outcome = (p: Promise<unknown>) => p.then(() => 'resolved', (e: MlockError) => `${e.type}/${e.reason}`);
      const all = Promise.all([outcome(ping), outcome(waiting), outcome(pinging)]);
      await sleep(50);
      c1.destroy();
      const first = await Promise.race([all, sleep(5000).then(() => undefined)]);
      proxy.refuse(false);
      assert.deepEqual(first, ['connection/destroyed', 'connection/destroyed', 'connection/destroyed']);
      await c2.ping();
      await c2.ping();
      await (await other.tryLock(name)).unlock();
    } finally {
      proxy.refuse(false);
      proxy.blackhole(false);
      c1.destroy();
      c2.destroy();
    }
  });
});

describe('a grant after a long wait', () => {
  let srv: Server;
  let proxy: Proxy;
  before(async () => {
    srv = await startServer(['--session-grace', '10s']);
    proxy = await startProxy(srv.port);
  });
  after(async () => {
    await proxy.close();
    await srv.cleanup();
  });
  // Two thirds of the ttl less its drift margin (ttl/100 + 5 ms).
  const minUsable = (ttl: number) => ((ttl - ttl / 100 - 5) * 2) / 3;

  test('arrives usable: the waiting session is answered every ttl/4, so a wait of 3 ttl leaves most of the lease', async () => {
    const holder = new Client({ host: '127.0.0.1', port: srv.port, socketId: `lw-h-${process.pid}` });
    const waiter = new Client({ host: '127.0.0.1', port: srv.port, socketId: `lw-w-${process.pid}` });
    try {
      const res = r('long-wait');
      const h = await holder.acquire(res, { ttl: 60000 });
      const waiting = waiter.acquire(res, { ttl: 1000, timeout: 9000 });
      await queued(holder, res, 2);
      await sleep(3000);
      await h.unlock();
      const l = await waiting;
      const left = l.deadline - Date.now();
      assert.ok(left >= minUsable(1000), `granted with ${left} ms left to believe, want at least ${minUsable(1000)}`);
      await l.unlock();
    } finally {
      holder.destroy();
      waiter.destroy();
    }
  });

  test('held back on its way, it is confirmed by an extend before acquire resolves', async () => {
    const holder = new Client({ host: '127.0.0.1', port: srv.port, socketId: `st-h-${process.pid}` });
    const waiter = new Client({ host: '127.0.0.1', port: proxy.port, socketId: `st-w-${process.pid}` });
    try {
      const res = r('stale');
      let drops = 0; // on a busy machine the held back pong may drop the connection: a resume probes with an extend
      waiter.on('disconnect', () => drops++);
      const h = await holder.acquire(res, { ttl: 60000 });
      const waiting = waiter.acquire(res, { ttl: 1000, timeout: 9000 });
      await queued(holder, res, 2);
      const before = (await holder.status()) as unknown as { extendCount: number };
      // The grant is pushed while the way back is held for 700 ms (less
      // than the second after which an unanswered ping drops the
      // connection): it arrives with about 285 ms of its lease.
      const resume = proxy.pause();
      await h.unlock();
      await sleep(700);
      resume();
      const l = await waiting;
      const left = l.deadline - Date.now();
      assert.ok(left >= minUsable(1000), `handed over with ${left} ms left to believe, want at least ${minUsable(1000)}`);
      assert.equal(l.error, undefined);
      const after = (await holder.status()) as unknown as { extendCount: number };
      const extends_ = after.extendCount - before.extendCount;
      assert.ok(extends_ >= 1 && extends_ <= 1 + drops, `${extends_} extends with ${drops} reconnections: want the confirmation, and a probe per resume`);
      await l.unlock();
    } finally {
      holder.destroy();
      waiter.destroy();
    }
  });
});

describe('a lock on a server that does not answer the handshake', () => {
  test("waits for the connection at most the lock's timeout, then fails with type timeout", async () => {
    // A cluster node without a leader accepts the connection and answers nothing.
    const silent = await fakeServer(() => {});
    const c = new Client({ host: '127.0.0.1', port: silent.port, socketId: r('silent'), dialTimeout: 5000 });
    try {
      const start = Date.now();
      const e = (await c.lock(r('job'), 60000, 400).then(
        () => assert.fail('granted'),
        (err: unknown) => err,
      )) as MlockError;
      const took = Date.now() - start;
      assert.equal(e.type, 'timeout', String(e));
      assert.match(e.message, /no connection/);
      assert.equal((e.cause as MlockError).type, 'connection');
      assert.ok(took >= 390 && took < 1500, `failed after ${took} ms, want about the lock's 400 ms`);
    } finally {
      c.destroy();
      silent.close();
    }
  });

  test('a lock that waited for the connection asks the server for what is left of its timeout', async () => {
    let asked = '';
    const late = await fakeServer((s, w) => {
      if (w[0] === 'connect') {
        setTimeout(() => s.write(encode('connected 1.0 new 15000')), 300); // the handshake, answered late
      } else if (w[0] === 'lock') {
        asked = w[4];
        const id = 'ab'.repeat(16);
        s.write(encode(`result ${w[1]} success ${id}`));
        s.write(encode(`timeout ${id}`));
      }
    });
    const c = new Client({ host: '127.0.0.1', port: late.port, socketId: r('late') });
    try {
      await c.lock(r('job'), 60000, 2000).then(
        () => assert.fail('granted'),
        (err: MlockError) => assert.equal(err.type, 'timeout', String(err)),
      );
      const ms = Number(asked);
      assert.ok(ms >= 1 && ms <= 1750, `asked the server to wait ${asked} ms, want 2000 less the wait for the handshake`);
    } finally {
      c.destroy();
      late.close();
    }
  });
});

// The session's clock (performance.now) made the test's: deadlines are reached
// by moving it, and reading a lock's held runs the session's timer at once (a
// lock past its deadline is lost when read). A scripted server grants every
// lock at once and answers pings; unlocks go to the test's onUnlock.
describe("a lock's deadline, on the test's clock", () => {
  let now = 0;
  afterEach(() => mock.restoreAll());
  const ttl = 10000;
  const deadlineAt = (sent: number) => sent + ttl - (ttl / 100 + 5); // the margin: span/100 + 5 ms
  async function scripted(onUnlock: (s: net.Socket, seq: string, id: string) => void) {
    mock.method(performance, 'now', () => now);
    now = 1000;
    const unlocks: string[] = [];
    let connects = 0;
    const fake = await fakeServer((s, w) => {
      if (w[0] === 'connect') s.write(encode(`connected 1.0 ${++connects > 1 ? 'resumed' : 'new'} 60000`));
      else if (w[0] === 'lock') {
        const id = randomBytes(16).toString('hex');
        s.write(encode(`result ${w[1]} success ${id}`));
        s.write(encode(`locked ${id} ${Date.now() + Number(w[3])} 1`));
      } else if (w[0] === 'unlock') {
        unlocks.push(w[2]);
        onUnlock(s, w[1], w[2]);
      } else s.write(encode(`result ${w[1]} success pong`));
    });
    const c = new Client({ host: '127.0.0.1', port: fake.port, socketId: `deadline-${process.pid}-${++n}`, pingInterval: 60000, maxBackoff: 20 });
    return { fake, c, unlocks };
  }

  test('locks due within a millisecond of each other are each lost at its own deadline, never before', async () => {
    const { fake, c, unlocks } = await scripted((s, seq) => s.write(encode(`result ${seq} failed lock not exist!`)));
    try {
      const a = await c.acquire(r('due-a'), { ttl });
      now += 0.5;
      const b = await c.acquire(r('due-b'), { ttl });
      now = deadlineAt(1000);
      assert.equal(a.held, false, 'a is lost at its deadline');
      assert.equal(a.error?.reason, 'expired');
      // b's deadline is half a millisecond later: it is still held, and not
      // given back to the server, which could grant it to the next waiter.
      assert.equal(b.held, true, "b was lost half a millisecond before its deadline");
      await until(() => unlocks.includes(a.id), 5000, "a's give-back");
      await c.ping(); // after a's give-back on the same connection
      assert.ok(!unlocks.includes(b.id), 'b was given back to the server before its deadline');
      now = deadlineAt(1000.5) - 0.001;
      assert.equal(b.held, true, 'b is lost before its deadline');
      now = deadlineAt(1000.5);
      assert.equal(b.held, false, 'b is lost at its deadline');
      await until(() => unlocks.includes(b.id), 5000, "b's give-back");
    } finally {
      c.destroy();
      fake.close();
    }
  });

  // The first unlock's answer is lost with the connection; the test moves the
  // clock while the unlock asked again waits, then the server answers that
  // it has no such lock.
  async function unlockAcrossFailover(sendAt: (d: number) => number, meanwhile: (d: number, l: Lock, s: net.Socket) => void): Promise<Lock> {
    const held: { s: net.Socket; seq: string }[] = [];
    let asked = 0;
    let ours = '';
    const { fake, c } = await scripted((s, seq, id) => {
      if (id !== ours) s.write(encode(`result ${seq} failed lock not exist!`)); // a give-back
      else if (++asked === 1) s.destroy(); // the first unlock: its answer lost with the connection
      else held.push({ s, seq });
    });
    try {
      const l = await c.acquire(r('unlock-failover'), { ttl });
      ours = l.id;
      const d = deadlineAt(1000);
      now = sendAt(d);
      const p = l.unlock();
      await until(() => held.length > 0, 5000, 'the unlock asked again');
      meanwhile(d, l, held[0].s);
      held[0].s.write(encode(`result ${held[0].seq} failed lock not exist!`));
      await p;
      return l;
    } finally {
      c.destroy();
      fake.close();
    }
  }

  test('an unlock sent before the deadline, asked again after it passed, and answered not found succeeds', async () => {
    // The deadline passed while it waited, and the session's timer lost the lock meanwhile.
    const l = await unlockAcrossFailover(
      (d) => d - 1,
      (d, l) => {
        now = d + 5;
        assert.equal(l.held, false, 'the lock is lost at its deadline');
      },
    );
    assert.equal(l.held, false);
    assert.equal(l.error?.reason, 'expired');
    await l.unlock(); // unlocking again resolves
    // The deadline passed while it waited; the timer that loses the lock may not have run.
    await unlockAcrossFailover(
      (d) => d - 1,
      (d) => {
        now = d + 5;
      },
    );
  });

  test('an unlock sent after the deadline, or of a lock the server said it lost, asked again and answered not found reports the loss', async () => {
    // Sent when the deadline had come (the timer that loses the lock had not run yet).
    await assert.rejects(
      unlockAcrossFailover(
        (d) => d,
        () => {},
      ),
      (e: MlockError) => e.type === 'lost' && e.reason === 'expired',
    );
    // Sent before the deadline; the server said meanwhile that an administrator evicted the lock.
    await assert.rejects(
      unlockAcrossFailover(
        (d) => d - 1,
        (_d, l, s) => s.write(encode(`expired ${l.id} evicted`)),
      ),
      (e: MlockError) => e.type === 'lost',
    );
  });
});

describe('the process stays alive for a call', () => {
  test('made while a reconnection is being dialled (the socket is held open with the call)', () => {
    // A child process with nothing else to keep it alive: its server's
    // handles are unref'd. The first connection is answered, then dropped
    // while the client is idle; the next is accepted and never answered, so
    // the lock made then waits for a connection being dialled, and fails
    // with type timeout after its 1.5 s. Before, that socket was not held
    // open with the call: the process exited with the call pending.
    const dir = mkdtempSync(join(tmpdir(), 'mlock-alive-'));
    try {
      const script = join(dir, 'child.js');
      writeFileSync(
        script,
        `const net = require('node:net');
const Client = require(process.env.MLOCK_PKG).default;
const { encode } = require(process.env.MLOCK_FRAMING);
let n = 0;
const srv = net.createServer((s) => {
  s.unref();
  s.on('error', () => {});
  if (++n > 1) return; // later connections: accepted, never answered
  s.on('data', (d) => {
    for (const f of d.toString().split('\\n')) {
      const w = f.slice(4).split(' ');
      if (w[0] === 'connect') s.write(encode('connected 1.0 new 15000'));
      if (w[0] === 'ping') {
        s.write(encode('result ' + w[1] + ' success pong'));
        setTimeout(() => s.destroy(), 50).unref(); // dropped while the client is idle
      }
    }
  });
});
srv.listen(0, '127.0.0.1', async () => {
  srv.unref();
  const keep = setInterval(() => {}, 1000); // alive until the call is made
  const c = new Client({ host: '127.0.0.1', port: srv.address().port, socketId: 'alive-' + process.pid });
  await c.ping();
  await new Promise((r) => c.once('disconnect', r));
  await new Promise((r) => setTimeout(r, 300)); // the reconnection's dial is on its way
  const t0 = Date.now();
  const call = c.lock('r', 60000, undefined, undefined, { deadline: Date.now() + 1500 }); // as locking-mlock asks
  clearInterval(keep); // from here on only the call holds the process
  const outcome = await call.then(() => 'granted', (e) => e.type);
  console.log(outcome + ' after ' + (Date.now() - t0) + ' ms');
  c.destroy();
});
`,
      );
      const out = execFileSync(process.execPath, [script], {
        env: { ...process.env, MLOCK_PKG: require.resolve('mlock'), MLOCK_FRAMING: require.resolve('mlock/dist/framing') },
        encoding: 'utf8',
        timeout: 20000,
      });
      assert.match(out, /^timeout after \d+ ms/, `the child printed ${JSON.stringify(out)}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
