// mlock bench-style figures from Node, in one run: the new client, the
// locking-mlock provider's execute, @medusajs/locking-redis's execute on a
// real Redis (REDIS_URL), a replica of the original client's behaviour (one
// packet per macrotask, result then locked), and the Go client (`mlock bench`,
// MLOCK_CLI) on the same server.
//
//   MLOCKD_BIN=... [MLOCK_CLI=...] [REDIS_URL=...] node build/test/bench.js [seconds] [workers]
//
// Scenarios (as mlock bench): uncontended (each worker its own key: lock,
// unlock, again) and hotkey (every worker on one key; hand-off = from the
// release to the next grant).
import { execFileSync } from 'node:child_process';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import Mlock from 'mlock';
import { MlockLockingProvider } from 'locking-mlock';
import Redis from 'ioredis';
import { startServer } from './helpers';

const seconds = Number(process.argv[2] ?? 3);
const workers = Number(process.argv[3] ?? 8);

interface Target {
  name: string;
  /** Takes key, runs the (empty) critical section, releases; onHeld runs inside it. */
  cycle(key: string, onHeld: () => void): Promise<void>;
  close(): Promise<void> | void;
}

interface Result {
  ops: number;
  perSec: number;
  p50: number;
  p99: number;
  handoffP50?: number;
  handoffP99?: number;
}

const pct = (xs: number[], p: number) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function run(t: Target, scenario: 'uncontended' | 'hotkey'): Promise<Result> {
  const lat: number[] = [];
  const handoff: number[] = [];
  let ops = 0;
  let releasedAt = 0;
  const hot = `bench-hot-${process.pid}-${t.name.replace(/\W/g, '')}`;
  const end = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      const key = scenario === 'hotkey' ? hot : `bench-${process.pid}-${t.name.replace(/\W/g, '')}-${w}`;
      while (performance.now() < end) {
        const t0 = performance.now();
        await t.cycle(key, () => {
          const now = performance.now();
          lat.push(now - t0);
          if (scenario === 'hotkey' && releasedAt) handoff.push(now - releasedAt);
          if (scenario === 'hotkey') releasedAt = performance.now(); // the release follows at once
        });
        ops++;
      }
    }),
  );
  const r: Result = { ops, perSec: ops / seconds, p50: pct(lat, 50), p99: pct(lat, 99) };
  if (scenario === 'hotkey') {
    r.handoffP50 = pct(handoff, 50);
    r.handoffP99 = pct(handoff, 99);
  }
  return r;
}

/** The original client's way, on the wire and in timing: packets handled one per macrotask, lock = result then locked. */
function originalClient(port: number): Promise<Target> {
  return new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    let buf = Buffer.alloc(0);
    let draining = false;
    let seq = 0;
    const pending = new Map<string, (ok: boolean, payload: string) => void>();
    const waits = new Map<string, () => void>();
    const write = (text: string) => {
      const b = Buffer.from(text);
      const f = Buffer.alloc(b.length + 5);
      f.writeInt32BE(b.length + 5, 0);
      b.copy(f, 4);
      f[f.length - 1] = 10;
      sock.write(f);
    };
    const onMessage = (text: string) => {
      const a = text.split(' ');
      if (a[0] === 'connected') resolve(target);
      else if (a[0] === 'result') {
        const p = pending.get(a[1]);
        pending.delete(a[1]);
        p?.(a[2] === 'success', a.slice(3).join(' '));
      } else if (a[0] === 'locked') {
        const w = waits.get(a[1]);
        waits.delete(a[1]);
        w?.();
      }
    };
    const drain = () => {
      draining = false;
      if (buf.length < 4) return;
      const len = buf.readInt32BE(0);
      if (buf.length < len) return;
      const text = buf.toString('utf8', 4, len - 1);
      buf = buf.subarray(len);
      onMessage(text);
      draining = true;
      setImmediate(drain);
    };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (!draining) drain();
    });
    sock.on('connect', () => write(`connect ${Math.random().toString(16).slice(2)} 1.0`));
    const call = (cmd: string) =>
      new Promise<string>((res, rej) => {
        const id = (++seq).toString(16);
        pending.set(id, (ok, payload) => (ok ? res(payload) : rej(new Error(payload))));
        write(cmd.replace('#', id));
      });
    const target: Target = {
      name: 'original client (replica)',
      async cycle(key, onHeld) {
        const id = await call(`lock # ${key} 10000 0 0`);
        // The original registered for "locked" after its result, a macrotask
        // later; a grant already pushed would be missed (the replica's
        // server answers in order, so it is not).
        await new Promise<void>((res) => {
          waits.set(id, res);
        });
        onHeld();
        await call(`unlock # ${id}`);
      },
      close() {
        sock.destroy();
      },
    };
  });
}

function fmt(ms: number | undefined): string {
  if (ms === undefined || Number.isNaN(ms)) return '-';
  return ms < 1 ? `${(ms * 1000).toFixed(0)}µs` : `${ms.toFixed(2)}ms`;
}

async function main() {
  const srv = await startServer(['--session-grace', '15s']);
  const targets: Target[] = [];
  const client = new Mlock({ host: '127.0.0.1', port: srv.port });
  targets.push({
    name: 'mlock client (Node)',
    async cycle(key, onHeld) {
      const l = await client.acquire(key, { ttl: 10000 });
      onHeld();
      await l.unlock();
    },
    close: () => client.destroy(),
  });
  const provider = new MlockLockingProvider({}, { url: `mlock://${srv.addr}`, namespace: 'bench:' });
  targets.push({
    name: 'locking-mlock execute',
    async cycle(key, onHeld) {
      await provider.execute(key, async () => onHeld(), { timeout: 30 });
    },
    close: () => provider.shutdown(),
  });
  targets.push(await originalClient(srv.port));
  if (process.env.REDIS_URL) {
    // The provider class as the module loader builds it (no module needed).
    const { RedisLockingProvider } = require('@medusajs/locking-redis/dist/services/redis-lock.js');
    const redisClient = new Redis(process.env.REDIS_URL);
    const redis = new RedisLockingProvider({ redisClient, prefix: `bench_${process.pid}:`, logger: undefined } as never, {} as never);
    targets.push({
      name: '@medusajs/locking-redis execute',
      async cycle(key, onHeld) {
        await redis.execute(key, async () => onHeld(), { timeout: 30 });
      },
      close: () => redisClient.disconnect(),
    });
  }
  console.log(`node ${process.version}, ${workers} workers, ${seconds} s per target and scenario, mlockd on ${srv.addr}${process.env.REDIS_URL ? `, redis ${process.env.REDIS_URL}` : ''}`);
  for (const scenario of ['uncontended', 'hotkey'] as const) {
    console.log(`\n${scenario}`);
    console.log(['target'.padEnd(34), 'ops/s'.padStart(9), 'p50'.padStart(9), 'p99'.padStart(9), scenario === 'hotkey' ? 'handoff p50'.padStart(12) + 'handoff p99'.padStart(12) : ''].join(' '));
    for (const t of targets) {
      const r = await run(t, scenario);
      console.log([t.name.padEnd(34), r.perSec.toFixed(0).padStart(9), fmt(r.p50).padStart(9), fmt(r.p99).padStart(9), scenario === 'hotkey' ? fmt(r.handoffP50).padStart(12) + fmt(r.handoffP99).padStart(12) : ''].join(' '));
    }
    if (process.env.MLOCK_CLI) {
      const out = execFileSync(process.env.MLOCK_CLI, ['bench', '--scenario', scenario, '--workers', String(workers), '--duration', `${seconds}s`, `mlock://${srv.addr}`], { encoding: 'utf8' });
      console.log(`Go client (mlock bench):\n${out.trim().split('\n').map((l) => `  ${l}`).join('\n')}`);
    }
  }
  for (const t of targets) await t.close();
  await srv.cleanup();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
