// The differential suite: one list of scenarios run through the real
// @medusajs/locking module against @medusajs/locking-redis on a real Redis
// and against locking-mlock on a real mlockd (built from this repository).
// Each scenario returns its outcome as text (results, error class, type and
// message, rough timings); the test prints both outcomes side by side and
// fails on any difference that js/README.md's table "Differences the
// differential suite shows" does not list with its reason.
//
// Both servers are reached through a TCP proxy of the test's own, so that
// "the server goes away" is the same event for both: every connection is cut
// and new ones are refused until it comes back.
//
// It needs REDIS_URL; without it the suite is skipped, except under CI=true,
// where it fails.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ILockingModule } from '@medusajs/framework/types';
import { type Proxy, type Server, sleep, startProxy, startServer } from './helpers';
import { LOCKING_MLOCK, loadLocking, registration } from './medusa';

const README = join(__dirname, '..', '..', 'README.md');

const REDIS_URL = process.env.REDIS_URL ?? '';
const inCI = process.env.CI === 'true';

/** What a scenario may use: modules of the target (one per namespace), the server's switch, and its own keys. */
interface Ctx {
  /** The locking module of the target with namespace ns (default: the suite's). */
  module(ns?: string): Promise<ILockingModule>;
  /** Cuts every connection to the server and refuses new ones. */
  down(): void;
  /** Lets connections through again. */
  up(): void;
  /** A key of this scenario. */
  k(name: string): string;
}

interface Scenario {
  name: string;
  run(c: Ctx): Promise<string[]>;
}

/** An outcome of a call: its value, or the error's class, type and message. */
function describeError(e: unknown): string {
  if (e instanceof Error) {
    const type = (e as { type?: string }).type;
    return `${e.constructor.name}${type ? `(${type})` : ''} "${e.message}"`;
  }
  return `thrown ${JSON.stringify(e)}`;
}

async function outcome<T>(p: Promise<T>): Promise<string> {
  try {
    const v = await p;
    return v === undefined ? 'ok' : JSON.stringify(v);
  } catch (e) {
    return describeError(e);
  }
}

/** The outcome of p with how long it took, in half seconds. */
async function timed<T>(p: Promise<T>): Promise<string> {
  const t0 = Date.now();
  const o = await outcome(p);
  return `${o} after ~${Math.round((Date.now() - t0) / 500) / 2}s`;
}

/** 'pending' if p has not settled within ms, else its outcome. */
async function within<T>(p: Promise<T>, ms: number): Promise<string> {
  const o = outcome(p);
  const r = await Promise.race([o, sleep(ms).then(() => 'pending')]);
  return r === 'pending' ? `pending after ${ms / 1000}s` : r;
}

const scenarios: Scenario[] = [
  {
    name: 'execute on one key: one job at a time',
    async run(c) {
      const m = await c.module();
      let inside = 0;
      let most = 0;
      const job = async () => {
        most = Math.max(most, ++inside);
        await sleep(20);
        inside--;
        return 'done';
      };
      const rs = await Promise.all(Array.from({ length: 6 }, () => outcome(m.execute(c.k('one'), job))));
      return [`at most ${most} job(s) at once`, ...rs];
    },
  },
  {
    name: 'execute on overlapping key sets',
    async run(c) {
      const m = await c.module();
      const holding = new Map<string, number>();
      let clash = 0;
      const job = (keys: string[]) => async () => {
        for (const k of keys) if ((holding.get(k) ?? 0) > 0) clash++;
        for (const k of keys) holding.set(k, (holding.get(k) ?? 0) + 1);
        await sleep(30);
        for (const k of keys) holding.set(k, holding.get(k)! - 1);
        return keys.length;
      };
      const sets = [['a', 'b'], ['b', 'c'], ['c'], ['a', 'c']].map((s) => s.map(c.k));
      const rs = await Promise.all(sets.map((s) => outcome(m.execute(s, job(s), { timeout: 5 }))));
      return [`${clash} overlap(s)`, ...rs];
    },
  },
  {
    name: 'acquire and release with owners',
    async run(c) {
      const m = await c.module();
      const k = c.k('key');
      return [
        await outcome(m.acquire(k, { ownerId: 'u1' })),
        await outcome(m.acquire(k, { ownerId: 'u2' })),
        await outcome(m.release(k, { ownerId: 'u2' })),
        await outcome(m.release(k, { ownerId: 'u1' })),
        await outcome(m.release(k, { ownerId: 'u1' })),
      ];
    },
  },
  {
    name: 'acquire and release without owner (anonymous "*")',
    async run(c) {
      const m = await c.module();
      const k = c.k('anon');
      return [
        await outcome(m.acquire(k)),
        await outcome(m.acquire(k)),
        await outcome(m.acquire(k, { ownerId: 'u1' })),
        await outcome(m.release(k, { ownerId: 'u1' })),
        await outcome(m.release(k)),
      ];
    },
  },
  {
    name: 're-acquire by the same owner renews',
    async run(c) {
      const m = await c.module();
      const k = c.k('again');
      const r = [await outcome(m.acquire(k, { ownerId: 'u1', expire: 1 })), await outcome(m.acquire(k, { ownerId: 'u1', expire: 5 }))];
      await sleep(1300); // past the first lease: the second one holds
      r.push(await outcome(m.acquire(k, { ownerId: 'u2' })));
      r.push(await outcome(m.release(k, { ownerId: 'u1' })));
      return r;
    },
  },
  {
    name: 're-acquire by the same owner with awaitQueue',
    async run(c) {
      const m = await c.module();
      const k = c.k('again_q');
      const r = [await outcome(m.acquire(k, { ownerId: 'u1', expire: 5 }))];
      const again = m.acquire(k, { ownerId: 'u1', expire: 5, awaitQueue: true } as never);
      r.push(await within(again, 1500));
      // Let a spinning attempt through, then clean up.
      await m.release(k, { ownerId: 'u1' });
      await again.catch(() => undefined);
      await m.release(k, { ownerId: 'u1' });
      return r;
    },
  },
  {
    name: 'releaseAll of an owner',
    async run(c) {
      const m = await c.module();
      const [k1, k2, k3] = [c.k('ra1'), c.k('ra2'), c.k('ra3')];
      await m.acquire(k1, { ownerId: 'u1' });
      await m.acquire(k2, { ownerId: 'u1' });
      await m.acquire(k3, { ownerId: 'u2' });
      const r = [await outcome(m.releaseAll({ ownerId: 'u1' }))];
      r.push(await outcome(m.acquire(k1, { ownerId: 'u3' })), await outcome(m.acquire(k2, { ownerId: 'u3' })), await outcome(m.acquire(k3, { ownerId: 'u3' })));
      await m.releaseAll({ ownerId: 'u3' });
      await m.releaseAll({ ownerId: 'u2' });
      return r;
    },
  },
  {
    name: 'releaseAll without owner (the anonymous locks)',
    async run(c) {
      const m = await c.module();
      const [k1, k2] = [c.k('rn1'), c.k('rn2')];
      await m.acquire(k1);
      await m.acquire(k2, { ownerId: 'u1' });
      const r = [await outcome(m.releaseAll())];
      r.push(await outcome(m.acquire(k1, { ownerId: 'u3' })), await outcome(m.acquire(k2, { ownerId: 'u3' })));
      await m.releaseAll({ ownerId: 'u3' });
      await m.releaseAll({ ownerId: 'u1' });
      return r;
    },
  },
  {
    name: 'expire ends an acquired lock',
    async run(c) {
      const m = await c.module();
      const k = c.k('exp');
      const r = [await outcome(m.acquire(k, { ownerId: 'u1', expire: 1 })), await outcome(m.acquire(k, { ownerId: 'u2' }))];
      await sleep(1300);
      r.push(await outcome(m.acquire(k, { ownerId: 'u2', expire: 5 })), await outcome(m.release(k, { ownerId: 'u1' })), await outcome(m.release(k, { ownerId: 'u2' })));
      return r;
    },
  },
  {
    name: 'execute times out behind a holder',
    async run(c) {
      const m = await c.module();
      const k = c.k('busy');
      await m.acquire(k, { ownerId: 'holder', expire: 10 });
      let ran = false;
      const r = [await timed(m.execute(k, async () => (ran = true), { timeout: 1 }))];
      r.push(`job ran: ${ran}`);
      await m.release(k, { ownerId: 'holder' });
      return r;
    },
  },
  {
    name: 'awaitQueue waits for the release',
    async run(c) {
      const m = await c.module();
      const k = c.k('queue');
      await m.acquire(k, { ownerId: 'u1', expire: 10 });
      const waiter = m.acquire(k, { ownerId: 'u2', expire: 10, awaitQueue: true } as never);
      const r = [await within(waiter, 300)];
      await m.release(k, { ownerId: 'u1' });
      r.push(await within(waiter, 3000));
      r.push(await outcome(m.release(k, { ownerId: 'u2' })));
      return r;
    },
  },
  {
    name: 'a multi-key acquire that fails holds nothing',
    async run(c) {
      const m = await c.module();
      const [a, b] = [c.k('mk_a'), c.k('mk_b')];
      await m.acquire(b, { ownerId: 'u1', expire: 10 });
      const r = [await outcome(m.acquire([a, b], { ownerId: 'u2', expire: 10 })), await outcome(m.acquire(a, { ownerId: 'u3', expire: 10 }))];
      await m.releaseAll({ ownerId: 'u1' });
      await m.releaseAll({ ownerId: 'u2' });
      await m.releaseAll({ ownerId: 'u3' });
      return r;
    },
  },
  {
    name: 'two namespaces on one server',
    async run(c) {
      const [a, b] = [await c.module('A'), await c.module('B')];
      const [k, n] = [c.k('shared'), c.k('anon')];
      for (const m of [a, b]) {
        await m.acquire(k, { ownerId: 'u1', expire: 10 });
        await m.acquire(n, { expire: 10 });
      }
      const r = [await outcome(a.releaseAll({ ownerId: 'u1' })), await outcome(a.releaseAll())];
      r.push(`A: ${await outcome(a.acquire(k, { ownerId: 'u9' }))}, ${await outcome(a.acquire(n, { ownerId: 'u9' }))}`);
      r.push(`B: ${await outcome(b.acquire(k, { ownerId: 'u9' }))}, ${await outcome(b.acquire(n, { ownerId: 'u9' }))}`);
      await a.releaseAll({ ownerId: 'u9' });
      await b.releaseAll({ ownerId: 'u1' });
      await b.releaseAll();
      return r;
    },
  },
  {
    name: 'the server is down: execute({timeout: 2})',
    async run(c) {
      const m = await c.module();
      await m.execute(c.k('warm'), async () => undefined); // connected before it goes
      c.down();
      try {
        let ran = false;
        const r = await timed(m.execute(c.k('down'), async () => (ran = true), { timeout: 2 }));
        return [r, `job ran: ${ran}`];
      } finally {
        c.up();
      }
    },
  },
  {
    name: 'the server comes back within execute\'s timeout',
    async run(c) {
      const m = await c.module();
      await m.execute(c.k('warm'), async () => undefined);
      c.down();
      const p = m.execute(c.k('back'), async () => 'ran', { timeout: 4 });
      await sleep(1000);
      c.up();
      return [await outcome(p)];
    },
  },
  {
    name: 'the server is down: acquire, then it comes back',
    async run(c) {
      const m = await c.module();
      await m.execute(c.k('warm'), async () => undefined);
      c.down();
      const p = m.acquire(c.k('later'), { ownerId: 'u1', expire: 10 });
      const r = [await within(p, 1500)];
      c.up();
      r.push(await within(p, 5000));
      r.push(await outcome(m.release(c.k('later'), { ownerId: 'u1' })));
      return r;
    },
  },
];

/** One provider under test: how to load its module for a namespace, and its proxy. */
interface Target {
  name: string;
  proxy: Proxy;
  load(namespace: string): Promise<ILockingModule>;
  close(m: ILockingModule): Promise<void>;
}

/** Runs every scenario on t and returns the outcomes by scenario. */
async function runAll(t: Target): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  let i = 0;
  for (const s of scenarios) {
    i++;
    const mods = new Map<string, ILockingModule>();
    const c: Ctx = {
      async module(ns = '') {
        let m = mods.get(ns);
        if (!m) {
          m = await t.load(`diff${process.pid}${ns}:`);
          mods.set(ns, m);
        }
        return m;
      },
      down() {
        t.proxy.refuse(true);
        t.proxy.cut();
      },
      up() {
        t.proxy.refuse(false);
      },
      k: (name) => `s${i}_${name}`,
    };
    try {
      out.set(s.name, await s.run(c));
    } catch (e) {
      out.set(s.name, [`scenario threw: ${describeError(e)}`]);
    } finally {
      c.up();
      for (const m of mods.values()) await t.close(m);
    }
  }
  return out;
}

/** The scenarios js/README.md lists as known differences, with their reasons. */
function listedDifferences(): Map<string, string> {
  const text = readFileSync(README, 'utf8');
  const start = text.indexOf('### Differences the differential suite shows');
  assert.ok(start >= 0, 'js/README.md has no section "Differences the differential suite shows"');
  const listed = new Map<string, string>();
  for (const line of text.slice(start).split('\n').slice(1)) {
    if (line.startsWith('#')) break;
    const cells = line.split('|').map((x) => x.trim());
    // | scenario | locking-redis | locking-mlock | reason |
    if (cells.length < 6 || cells[1] === 'scenario' || /^-+$/.test(cells[1])) continue;
    const reason = cells[4];
    assert.ok(reason, `js/README.md lists "${cells[1]}" without a reason`);
    listed.set(cells[1].replace(/\\\|/g, '|'), reason);
  }
  return listed;
}

describe('differential: @medusajs/locking-redis and locking-mlock, the same scenarios', { skip: REDIS_URL || inCI ? false : 'REDIS_URL is not set' }, () => {
  let srv: Server;
  const targets: Target[] = [];
  before(async () => {
    assert.ok(REDIS_URL, 'REDIS_URL is not set: CI must start redis-server for the differential suite');
    const u = new URL(REDIS_URL);
    const redisProxy = await startProxy(Number(u.port || 6379));
    const db = u.pathname.replace('/', '') || '0';
    targets.push({
      name: 'locking-redis',
      proxy: redisProxy,
      load: (namespace) =>
        loadLocking({ resolve: require.resolve('@medusajs/locking-redis'), id: 'locking-redis', options: { redisUrl: `redis://${redisProxy.addr}/${db}`, namespace } }, true),
      async close(m) {
        (registration(m, 'locking-redis').redisClient as { disconnect(): void }).disconnect();
      },
    });
    srv = await startServer(['--session-grace', '3s']);
    const mlockProxy = await startProxy(srv.port);
    targets.push({
      name: 'locking-mlock',
      proxy: mlockProxy,
      load: (namespace) => loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${mlockProxy.addr}`, namespace } }, true),
      async close(m) {
        await (registration(m, 'locking-mlock') as { shutdown(): Promise<void> }).shutdown();
      },
    });
  });
  after(async () => {
    for (const t of targets) await t.proxy.close();
    await srv?.cleanup();
  });

  test('every difference is listed in js/README.md with its reason', async () => {
    const listed = listedDifferences();
    // Side by side: each target has its own server, proxy and keys.
    const [redis, mlock] = await Promise.all([runAll(targets[0]), runAll(targets[1])]);
    const rows: string[] = [];
    const unlisted: string[] = [];
    const stale: string[] = [];
    for (const s of scenarios) {
      const a = redis.get(s.name)!;
      const b = mlock.get(s.name)!;
      const same = JSON.stringify(a) === JSON.stringify(b);
      const verdict = same ? 'same' : listed.has(s.name) ? 'listed' : 'DIFFERENT';
      if (!same && !listed.has(s.name)) unlisted.push(s.name);
      if (same && listed.has(s.name)) stale.push(s.name);
      rows.push(`| ${s.name} | ${a.join('; ')} | ${b.join('; ')} | ${verdict} |`);
    }
    console.log(['', '| scenario | locking-redis | locking-mlock | verdict |', '|---|---|---|---|', ...rows, ''].join('\n'));
    if (stale.length) console.log(`listed in js/README.md but the same now: ${stale.join(', ')}`);
    assert.deepEqual(unlisted, [], `differences not listed in js/README.md: ${unlisted.join(', ')}`);
  });
});
