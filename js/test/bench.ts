// mlock bench-style figures from Node, in one run: the new client, the
// locking-mlock provider's execute, @medusajs/locking-redis's execute on a
// real Redis (REDIS_URL), a replica of the original client's behaviour (one
// packet per macrotask, result then locked), and the Go client (`mlock bench`,
// MLOCK_CLI) on the same server.
//
//   MLOCKD_BIN=... [MLOCK_CLI=...] [REDIS_URL=...] node build/test/bench.js [seconds] [workers] [rounds]
//
// With rounds > 1 every target runs once per round, the targets in turn
// (interleaved: a noisy neighbour hurts them alike), and the table shows
// each round's ops/s and their median. MLOCK_BENCH_TARGETS (comma-separated
// parts of target names) and MLOCK_BENCH_SCENARIOS (uncontended,hotkey)
// narrow the run, for profiling one target (node --cpu-prof).
// MLOCK_BENCH_BEFORE names the js/ directory of another build (its packages
// built): its client and provider run as targets too ("... before"), for a
// before-and-after in one run; several, as label=dir,label=dir, run as
// "... label" each.
//
// Scenarios (as mlock bench): uncontended (each worker its own key: lock,
// unlock, again) and hotkey (every worker on one key; hand-off = from the
// release to the next grant). cpu/op is this process's CPU time (user and
// system) per operation, server cpu mlockd's (from /proc) or Redis's (its
// INFO cpu) per operation, both over the target's run; others is the CPU the
// rest of the machine used meanwhile, in cores (from /proc/stat: near 0 on a
// quiet machine, where single rounds can be compared).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import Mlock from 'mlock';
import { MlockLockingProvider } from 'locking-mlock';
import Redis from 'ioredis';
import { startServer } from './helpers';

const seconds = Number(process.argv[2] ?? 3);
const workers = Number(process.argv[3] ?? 8);
const rounds = Number(process.argv[4] ?? 1);
const only = process.env.MLOCK_BENCH_TARGETS?.split(',').filter(Boolean);
// The other builds: MLOCK_BENCH_BEFORE=dir ("before"), or label=dir,label=dir,...
const builds = (process.env.MLOCK_BENCH_BEFORE?.split(',').filter(Boolean) ?? []).map((x, _, all) => {
  const eq = x.indexOf('=');
  if (eq > 0) return { label: x.slice(0, eq), dir: x.slice(eq + 1) };
  return { label: all.length === 1 ? 'before' : x, dir: x };
});
const scenarios = (process.env.MLOCK_BENCH_SCENARIOS?.split(',').filter(Boolean) ?? ['uncontended', 'hotkey']) as ('uncontended' | 'hotkey')[];

interface Target {
  name: string;
  /** Takes key, runs the (empty) critical section, releases; onHeld runs inside it. */
  cycle(key: string, onHeld: () => void): Promise<void>;
  close(): Promise<void> | void;
  /** CPU time (user + system, µs) the server process has used so far, if it can be read. */
  serverCpu?(): Promise<number>;
  /** The server's reads and writes so far (mlockd's status), if it can be asked. */
  serverIo?(): Promise<{ reads: number; writes: number }>;
}

interface Result {
  ops: number;
  perSec: number;
  p50: number;
  p99: number;
  handoffP50?: number;
  handoffP99?: number;
  /** This process's CPU time per operation, µs. */
  cpu: number;
  /** The server's CPU time per operation, µs (NaN: unknown). */
  serverCpu: number;
  /**
   * The CPU the rest of the machine used meanwhile (every process but this
   * one and the server), in cores: near 0 on a quiet machine.
   */
  others: number;
  /** The server's socket reads and writes per operation (NaN: unknown). */
  reads: number;
  writes: number;
}

/** CPU time (user + system, µs) process pid has used, from /proc (NaN where there is none). */
function procCpu(pid: number | undefined): number {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const w = f.slice(f.lastIndexOf(')') + 2).split(' ');
    // utime and stime are fields 14 and 15, in clock ticks (100 per second on Linux).
    return (Number(w[11]) + Number(w[12])) * 10000;
  } catch {
    return NaN;
  }
}

/** CPU time (µs) every CPU of the machine has been busy so far, from /proc/stat (NaN where there is none). */
function machineCpu(): number {
  try {
    const w = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    return (w[0] + w[1] + w[2] + w[5] + w[6] + (w[7] ?? 0)) * 10000;
  } catch {
    return NaN;
  }
}

const pct = (xs: number[], p: number) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function run(t: Target, scenario: 'uncontended' | 'hotkey', round: number): Promise<Result> {
  const lat: number[] = [];
  const handoff: number[] = [];
  let ops = 0;
  let releasedAt = 0;
  const hot = `bench-hot-${process.pid}-${t.name.replace(/\W/g, '')}-${round}`;
  const cpu0 = process.cpuUsage();
  const srv0 = t.serverCpu ? await t.serverCpu() : NaN;
  const io0 = t.serverIo ? await t.serverIo() : { reads: NaN, writes: NaN };
  const all0 = machineCpu();
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      const key = scenario === 'hotkey' ? hot : `bench-${process.pid}-${t.name.replace(/\W/g, '')}-${round}-${w}`;
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
  const cpu = process.cpuUsage(cpu0);
  const all1 = machineCpu();
  const wall = (performance.now() - start) * 1000;
  const srv1 = t.serverCpu ? await t.serverCpu() : NaN;
  const io1 = t.serverIo ? await t.serverIo() : { reads: NaN, writes: NaN };
  const r: Result = {
    ops,
    perSec: ops / seconds,
    p50: pct(lat, 50),
    p99: pct(lat, 99),
    cpu: (cpu.user + cpu.system) / ops,
    serverCpu: (srv1 - srv0) / ops,
    reads: (io1.reads - io0.reads) / ops,
    writes: (io1.writes - io0.writes) / ops,
    others: Math.max(0, all1 - all0 - (cpu.user + cpu.system) - (Number.isNaN(srv1 - srv0) ? 0 : srv1 - srv0)) / wall,
  };
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

/** CPU per operation, µs. */
function cpuFmt(us: number): string {
  return Number.isNaN(us) ? '-' : `${us.toFixed(1)}µs`;
}

async function main() {
  const srv = await startServer(['--session-grace', '15s']);
  const targets: Target[] = [];
  const mlockdCpu = async () => procCpu(srv.proc.pid);
  // A session of its own, for the server's counters.
  const statusClient = new Mlock({ host: '127.0.0.1', port: srv.port, socketId: `bench-status-${process.pid}` });
  const mlockdIo = async () => {
    const st = await statusClient.status();
    return { reads: Number(st.reads), writes: Number(st.writes) };
  };
  const client = new Mlock({ host: '127.0.0.1', port: srv.port });
  targets.push({
    name: 'mlock client (Node)',
    async cycle(key, onHeld) {
      const l = await client.acquire(key, { ttl: 10000 });
      onHeld();
      await l.unlock();
    },
    close: () => client.destroy(),
    serverCpu: mlockdCpu,
    serverIo: mlockdIo,
  });
  const provider = new MlockLockingProvider({}, { url: `mlock://${srv.addr}`, namespace: 'bench:' });
  targets.push({
    name: 'locking-mlock execute',
    async cycle(key, onHeld) {
      await provider.execute(key, async () => onHeld(), { timeout: 30 });
    },
    close: () => provider.shutdown(),
    serverCpu: mlockdCpu,
    serverIo: mlockdIo,
  });
  targets.push({ ...(await originalClient(srv.port)), serverCpu: mlockdCpu, serverIo: mlockdIo });
  for (const { label, dir } of builds) {
    const Before = require(join(dir, 'packages', 'mlock', 'dist', 'index.js')) as typeof Mlock;
    const { MlockLockingProvider: BeforeProvider } = require(join(dir, 'packages', 'locking-mlock', 'dist', 'index.js')) as { MlockLockingProvider: typeof MlockLockingProvider };
    const before = new Before({ host: '127.0.0.1', port: srv.port });
    targets.push({
      name: `mlock client (Node) ${label}`,
      async cycle(key, onHeld) {
        const l = await before.acquire(key, { ttl: 10000 });
        onHeld();
        await l.unlock();
      },
      close: () => before.destroy(),
      serverCpu: mlockdCpu,
    serverIo: mlockdIo,
    });
    const beforeProvider = new BeforeProvider({}, { url: `mlock://${srv.addr}`, namespace: `bench-${label}:` });
    targets.push({
      name: `locking-mlock execute ${label}`,
      async cycle(key, onHeld) {
        await beforeProvider.execute(key, async () => onHeld(), { timeout: 30 });
      },
      close: () => beforeProvider.shutdown(),
      serverCpu: mlockdCpu,
    serverIo: mlockdIo,
    });
  }
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
      async serverCpu() {
        // Redis's own count, in seconds: used_cpu_sys and used_cpu_user.
        const info = await redisClient.info('cpu');
        const sec = (k: string) => Number(new RegExp(`^${k}:([\\d.]+)`, 'm').exec(info)?.[1] ?? NaN);
        return (sec('used_cpu_sys') + sec('used_cpu_user')) * 1e6;
      },
    });
  }
  console.log(`node ${process.version}, ${workers} workers, ${seconds} s per target and scenario${rounds > 1 ? `, ${rounds} rounds` : ''}, mlockd on ${srv.addr}${process.env.REDIS_URL ? `, redis ${process.env.REDIS_URL}` : ''}`);
  const running = only?.length ? targets.filter((t) => only.some((o) => t.name.includes(o))) : targets;
  const row = (name: string, r: Result, hot: boolean) =>
    [
      name.padEnd(34),
      r.perSec.toFixed(0).padStart(9),
      fmt(r.p50).padStart(9),
      fmt(r.p99).padStart(9),
      hot ? fmt(r.handoffP50).padStart(12) + fmt(r.handoffP99).padStart(12) : '',
      cpuFmt(r.cpu).padStart(10),
      cpuFmt(r.serverCpu).padStart(12),
      Number.isNaN(r.reads) ? '-'.padStart(11) : `${r.reads.toFixed(2)}/${r.writes.toFixed(2)}`.padStart(11),
      Number.isNaN(r.others) ? '-'.padStart(7) : r.others.toFixed(2).padStart(7),
    ].join(' ');
  for (const scenario of scenarios) {
    const hot = scenario === 'hotkey';
    console.log(`\n${scenario}`);
    console.log(
      ['target'.padEnd(34), 'ops/s'.padStart(9), 'p50'.padStart(9), 'p99'.padStart(9), hot ? 'handoff p50'.padStart(12) + 'handoff p99'.padStart(12) : '', 'cpu/op'.padStart(10), 'server cpu'.padStart(12), 'srv rd/wr'.padStart(11), 'others'.padStart(7)].join(' '),
    );
    const perRound = new Map<string, number[]>(running.map((t) => [t.name, []]));
    for (let round = 0; round < rounds; round++) {
      for (const t of running) {
        const r = await run(t, scenario, round);
        perRound.get(t.name)!.push(r.perSec);
        console.log(row(rounds > 1 ? `${t.name} #${round + 1}` : t.name, r, hot));
      }
    }
    if (rounds > 1) {
      const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
      console.log(`\n${scenario}: ops/s per round, median`);
      for (const [name, xs] of perRound) console.log(`${name.padEnd(34)} ${xs.map((x) => x.toFixed(0).padStart(7)).join(' ')}   median ${median(xs).toFixed(0)}`);
      // Ratios within each round: the two targets ran side by side.
      const ratio = (a: string, b: string) => {
        const xa = perRound.get(a);
        const xb = perRound.get(b);
        if (!xa || !xb) return;
        const rs = xa.map((x, i) => x / xb[i]);
        console.log(`${`${a} / ${b}`.padEnd(70)} ${rs.map((x) => x.toFixed(2)).join(' ')}   median ${median(rs).toFixed(2)}`);
      };
      ratio('mlock client (Node)', 'original client (replica)');
      ratio('locking-mlock execute', '@medusajs/locking-redis execute');
      for (const { label } of builds) {
        ratio('mlock client (Node)', `mlock client (Node) ${label}`);
        ratio('locking-mlock execute', `locking-mlock execute ${label}`);
        ratio(`mlock client (Node) ${label}`, 'original client (replica)');
        ratio(`locking-mlock execute ${label}`, '@medusajs/locking-redis execute');
      }
    }
    if (process.env.MLOCK_CLI) {
      const out = execFileSync(process.env.MLOCK_CLI, ['bench', '--scenario', scenario, '--workers', String(workers), '--duration', `${seconds}s`, `mlock://${srv.addr}`], { encoding: 'utf8' });
      console.log(`Go client (mlock bench):\n${out.trim().split('\n').map((l) => `  ${l}`).join('\n')}`);
    }
  }
  for (const t of targets) await t.close();
  statusClient.destroy();
  await srv.cleanup();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
