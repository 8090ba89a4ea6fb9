// Test helpers: real mlockd processes on free loopback ports (the binary
// built from this repository, named by MLOCKD_BIN), stopped by their PID, and
// a small TCP proxy that can cut or black-hole connections.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const BIN = process.env.MLOCKD_BIN ?? '';

/**
 * The first port of the range the kernel gives outgoing connections
 * (Linux), or 0 if it does not say. Read once.
 */
const ephemeralLow = ((): number => {
  try {
    return Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || 0;
  } catch {
    return 0;
  }
})();

/** Listens on port (0: any) of loopback for a moment; resolves with the port, or rejects if it is taken. */
function tryPort(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(port, '127.0.0.1', () => {
      const p = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(p));
    });
  });
}

/**
 * Where the test processes of this machine claim the ports they draw (this
 * file's freePort, and FreeAddr in the Go tests, internal/proctest): a file
 * per port holding the claiming process's id, so that two test processes
 * of a run never draw the same port.
 */
export const claimDir = join(tmpdir(), 'mlock-test-ports');
/** A claim older than this is stale whatever its process id says. */
const claimMaxAgeMs = 6 * 3600 * 1000;

function alive(pid: number): boolean {
  if (!(pid > 0)) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether the claim file name was left by a process that is gone. */
function claimStale(name: string): boolean {
  let age: number;
  try {
    age = Date.now() - statSync(name).mtimeMs;
  } catch {
    return true; // removed meanwhile
  }
  if (age > claimMaxAgeMs) return true;
  const text = readFileSync(name, 'utf8').trim();
  if (!/^[0-9]+$/.test(text)) return age > 60_000; // being written, or garbage
  const pid = Number(text);
  return pid !== process.pid && !alive(pid);
}

/**
 * Claims port for this process, for as long as it runs: false if another
 * live process holds it (a claim of a process that has exited is taken
 * over). Where the directory cannot be written, every port is granted.
 */
export function claimPort(port: number): boolean {
  try {
    mkdirSync(claimDir, { recursive: true });
  } catch {
    return true;
  }
  const name = join(claimDir, String(port));
  for (let i = 0; i < 2; i++) {
    try {
      const fd = openSync(name, 'wx', 0o666);
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') return true;
    }
    try {
      if (!claimStale(name)) return false;
      unlinkSync(name);
    } catch {
      // removed by another process meanwhile: try again
    }
  }
  return false;
}

/** The ports freePort returned in this process: never twice. */
const handedOut = new Set<number>();

/**
 * A loopback port that was free a moment ago, not returned before in this
 * process and not claimed by another test process still running
 * (claimPort). Where the kernel says which ports it gives outgoing
 * connections, it is drawn below that range (from 10000), as the Go tests'
 * FreeAddr does: the connections other processes open meanwhile never take
 * it before the server it is meant for binds it.
 */
export async function freePort(): Promise<number> {
  const low = ephemeralLow;
  for (let i = 0; i < 100; i++) {
    let port: number;
    try {
      port = await tryPort(low >= 11000 ? 10000 + Math.floor(Math.random() * (low - 10000)) : 0);
    } catch {
      continue; // taken: draw again
    }
    if (!handedOut.has(port) && claimPort(port)) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error('no new free port in 100 tries');
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls cond every 10 ms until it is true, at most ms; throws if it never is. */
export async function until(cond: () => boolean | Promise<boolean>, ms = 10000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

export interface Server {
  port: number;
  addr: string;
  proc: ChildProcess;
  /** SIGTERM, wait for exit. */
  stop(): Promise<void>;
  /** SIGKILL, wait for exit. */
  kill(): Promise<void>;
  /** Start again on the same port and data directory. */
  start(): Promise<void>;
  /** Stop and remove the data directory. */
  cleanup(): Promise<void>;
}

const servers = new Set<Server>();
process.on('exit', () => {
  for (const s of servers) if (s.proc.exitCode === null) s.proc.kill('SIGKILL');
});

/** Starts mlockd with extra flags on a free loopback port. */
export async function startServer(extra: string[] = [], port?: number): Promise<Server> {
  if (!BIN) throw new Error('MLOCKD_BIN is not set');
  const p = port ?? (await freePort());
  const dir = mkdtempSync(join(tmpdir(), 'mlockd-js-'));
  const args = ['--listen', `127.0.0.1:${p}`, '--data-dir', join(dir, 'data'), '--quiet-period', '0', '--log-level', 'warn', ...extra];
  const s: Server = {
    port: p,
    addr: `127.0.0.1:${p}`,
    proc: undefined as unknown as ChildProcess,
    async start() {
      s.proc = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'inherit'] });
      await until(() => s.proc.exitCode !== null || canConnect(p), 10000, `mlockd on ${p}`);
      if (s.proc.exitCode !== null) throw new Error(`mlockd exited with ${s.proc.exitCode}`);
    },
    async stop() {
      await signal(s.proc, 'SIGTERM');
    },
    async kill() {
      await signal(s.proc, 'SIGKILL');
    },
    async cleanup() {
      await signal(s.proc, 'SIGKILL');
      servers.delete(s);
      rmSync(dir, { recursive: true, force: true });
    },
  };
  servers.add(s);
  await s.start();
  return s;
}

function signal(proc: ChildProcess, sig: NodeJS.Signals): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    proc.once('exit', () => resolve());
    proc.kill(sig);
  });
}

/** A 3-node cluster (see docs/cluster.md), fast Raft timeouts. */
export async function startCluster(): Promise<{ nodes: Server[]; uri: string; cleanup(): Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'mlockd-cluster-'));
  const secret = join(dir, 'secret');
  writeFileSync(secret, 'a-secret-shared-by-the-test-nodes-0123456789');
  const ports = [await freePort(), await freePort(), await freePort()];
  const raft = [await freePort(), await freePort(), await freePort()];
  const peers = ['a', 'b', 'c'].map((id, i) => `${id}=127.0.0.1:${raft[i]}`).join(',');
  const nodes = await Promise.all(
    ['a', 'b', 'c'].map((id, i) =>
      startServer(
        ['--cluster-id', id, '--raft-addr', `127.0.0.1:${raft[i]}`, '--raft-dir', join(dir, id), '--cluster-peers', peers,
          '--cluster-secret-file', secret, '--raft-heartbeat', '200ms', '--raft-election', '200ms'],
        ports[i],
      ),
    ),
  );
  return {
    nodes,
    uri: `mlock://${nodes.map((n) => n.addr).join(',')}`,
    async cleanup() {
      await Promise.all(nodes.map((n) => n.cleanup()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A TCP proxy to target: cut() closes every connection; blackhole(true)
 * swallows data both ways; dropBack(true) swallows what the server sends;
 * pause() holds what the server sends until the returned resume().
 */
export interface Proxy {
  port: number;
  addr: string;
  cut(): void;
  blackhole(on: boolean): void;
  dropBack(on: boolean): void;
  pause(): () => void;
  /** Stop accepting (new connections are refused) or accept again. */
  refuse(on: boolean): void;
  close(): Promise<void>;
  connections: number;
}

export async function startProxy(target: number): Promise<Proxy> {
  const socks = new Set<net.Socket>();
  let holed = false;
  let dropping = false;
  let held: { c: net.Socket; d: Buffer }[] | undefined;
  let refusing = false;
  const port = await freePort();
  const srv = net.createServer((c) => {
    if (refusing) {
      c.destroy();
      return;
    }
    p.connections++;
    const u = net.connect({ host: '127.0.0.1', port: target });
    socks.add(c);
    socks.add(u);
    c.on('data', (d) => {
      if (!holed) u.write(d);
    });
    u.on('data', (d: Buffer) => {
      if (holed || dropping) return;
      if (held) held.push({ c, d });
      else c.write(d);
    });
    const end = () => {
      c.destroy();
      u.destroy();
      socks.delete(c);
      socks.delete(u);
    };
    c.on('close', end);
    u.on('close', end);
    c.on('error', end);
    u.on('error', end);
  });
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', () => r()));
  const p: Proxy = {
    port,
    addr: `127.0.0.1:${port}`,
    connections: 0,
    cut() {
      for (const s of socks) s.destroy();
      socks.clear();
    },
    blackhole(on) {
      holed = on;
    },
    dropBack(on) {
      dropping = on;
    },
    pause() {
      const mine: { c: net.Socket; d: Buffer }[] = [];
      held = mine;
      return () => {
        if (held === mine) held = undefined;
        for (const { c, d } of mine) if (!c.destroyed) c.write(d);
      };
    },
    refuse(on) {
      refusing = on;
    },
    close() {
      p.cut();
      return new Promise((r) => srv.close(() => r()));
    },
  };
  return p;
}

/** Waits until the server's queue of resource holds n entries (the holder included; 0: not listed), asking through c. */
export async function queued(c: { status(): Promise<Record<string, unknown>> }, resource: string, n: number): Promise<void> {
  await until(async () => (((await c.status()).queues as Record<string, number>)[resource] ?? 0) === n, 10000, `${n} in the queue of ${resource}`);
}

/**
 * A fake server on real TCP: each frame read, split into words, goes to
 * onFrame with its socket. close() stops it and its connections.
 */
export async function fakeServer(
  onFrame: (s: net.Socket, w: string[]) => void,
): Promise<{ port: number; addr: string; close(): void }> {
  const port = await freePort();
  const socks = new Set<net.Socket>();
  const srv = net.createServer((s) => {
    socks.add(s);
    s.on('close', () => socks.delete(s));
    s.on('error', () => {});
    let buf = Buffer.alloc(0);
    s.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= buf.readInt32BE(0)) {
        const len = buf.readInt32BE(0);
        const w = buf.toString('utf8', 4, len - 1).split(' ');
        buf = buf.subarray(len);
        onFrame(s, w);
      }
    });
  });
  await new Promise<void>((res) => srv.listen(port, '127.0.0.1', () => res()));
  return {
    port,
    addr: `127.0.0.1:${port}`,
    close() {
      srv.close();
      for (const s of socks) s.destroy();
    },
  };
}
