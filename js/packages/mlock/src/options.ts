import { readFileSync } from 'node:fs';
import type { ConnectionOptions } from 'node:tls';
import { MlockError } from './errors';

/** The default port of mlockd. */
export const DEFAULT_PORT = 12340;

/**
 * Options of a client. The names and meanings of the first ones are the
 * original client's; every field is optional.
 */
export interface MlockOptions {
  /**
   * `mlock://[name:token@]host[:port][,host[:port]...][?ttl=&timeout=&tolerate=&prefix=&socketId=&debug=&stay-on-node=]`
   * (`mlocks://`, or `tls=1`, `tls-ca=<file>`, `tls-cert=<file>&tls-key=<file>`, `tls-server-name=`: TLS);
   * its values win over the fields below.
   */
  uri?: string;
  /** Server host. Default `localhost`. */
  host?: string;
  /** Server port. Default 12340 (the original client had none and threw). */
  port?: number;
  /** The nodes of a cluster (`host[:port]`): the client connects to one and moves to the next when it fails. Default: host and port. */
  addrs?: string[];
  /** Put before every resource name (each part of `a|b`). No `|` or space. Default none. */
  prefix?: string;
  /** Default lease of a lock and of extend, ms. Default 60000 (the server's default lease). */
  ttl?: number;
  /** Default longest wait for a lock, ms; 0 waits without limit. Default 0. */
  timeout?: number;
  /** Default tolerate: N > 0 fails at once when a queue already holds more than N entries; 0: no limit. Default 0. */
  tolerate?: number;
  /** The session id. Default: 128 random bits, one session shared by the clients of the address. A client that names its own socketId gets a session (and connection) of its own; it stays the same across reconnects. A secret: whoever presents it owns the session's locks. */
  socketId?: string;
  /** Log connection events with console.debug. Default false. */
  debug?: boolean;
  /** Principal name for servers with authentication (with token). */
  name?: string;
  /** The principal's token (a secret; never logged). */
  token?: string;
  /** TLS options: speak TLS to the server (the `mlocks://` scheme sets `{}`). Default: plain TCP. */
  tls?: ConnectionOptions;
  /**
   * Bound of a connection attempt, and of how long a call waits for the connection while it is down, ms. A lock
   * with a shorter wait timeout waits at most that (then type `timeout`, its cause the connection's error) and asks
   * the server for what is left of it. Default 5000.
   */
  dialTimeout?: number;
  /** How often an idle connection is checked while nothing is held or waited for, ms. Default 20000. */
  pingInterval?: number;
  /** Longest delay between reconnection rounds, ms. Default 5000. */
  maxBackoff?: number;
  /**
   * Keep the session on the node it connects to. By default, with several
   * addresses, the session's first connection asks the node to name the
   * cluster's leader (`want=leader`); when a follower that created the session
   * names one of the addresses (compared as written, letter case aside), the
   * session moves to the leader at once: every request then saves the
   * follower's forwarding hop. A move is one more connect, never a failure:
   * if the leader does not answer, the session goes back to the follower and
   * stays. Later connections stay on the node they reach. URI:
   * `stay-on-node=1`. Default false.
   */
  stayOnNode?: boolean;
}

/** Options with defaults applied. */
export interface Resolved {
  addrs: { host: string; port: number; addr: string }[];
  prefix: string;
  ttl: number;
  timeout: number;
  tolerate: number;
  socketId?: string;
  debug: boolean;
  name?: string;
  token?: string;
  tls?: ConnectionOptions;
  dialTimeout: number;
  pingInterval: number;
  maxBackoff: number;
  stayOnNode: boolean;
}

function bad(msg: string): MlockError {
  return new MlockError(msg, 'request');
}

/** Milliseconds: a number, a decimal string, or a duration such as 5s, 1m30s, 250ms. */
export function parseMs(name: string, v: unknown): number {
  if (typeof v === 'number') {
    if (!Number.isInteger(v) || v < 0) throw bad(`${name} should be a whole number of milliseconds >= 0, not ${v}`);
    return v;
  }
  if (typeof v === 'string') {
    if (/^\d+$/.test(v)) return Number(v);
    const re = /(\d+(?:\.\d+)?)(ms|h|m|s)/g;
    let total = 0;
    let used = 0;
    for (const m of v.matchAll(re)) {
      const n = Number(m[1]);
      total += n * (m[2] === 'ms' ? 1 : m[2] === 's' ? 1e3 : m[2] === 'm' ? 6e4 : 36e5);
      used += m[0].length;
    }
    if (used === v.length && used > 0) return Math.round(total);
  }
  throw bad(`${name}=${JSON.stringify(v)}: want milliseconds >= 0 or a duration such as 5s`);
}

function parseCount(name: string, v: unknown): number {
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw bad(`${name} should be a whole number >= 0, not ${JSON.stringify(v)}`);
  return n;
}

/** Splits host[:port] (IPv6 in brackets). */
export function splitAddr(s: string, defPort: number): { host: string; port: number; addr: string } {
  let host = s;
  let port = defPort;
  const m = /^\[([^\]]+)\](?::(\d+))?$/.exec(s) ?? /^([^:]*)(?::(\d+))?$/.exec(s);
  if (m) {
    host = m[1];
    if (m[2] !== undefined) port = Number(m[2]);
  } else if (s.includes(':') && !s.includes('[')) {
    host = s; // a bare IPv6 literal
  } else {
    throw bad(`invalid address ${JSON.stringify(s)}`);
  }
  if (!host) throw bad(`empty host in address ${JSON.stringify(s)}`);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw bad(`invalid port in address ${JSON.stringify(s)}`);
  host = host.toLowerCase();
  const addr = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
  return { host, port, addr };
}

/** Parses an mlock:// (or mlocks://) URI into options. */
export function parseURI(uri: string): MlockOptions {
  const m = /^(mlocks?):\/\/([^/?#]*)(\/?)(?:\?([^#]*))?$/.exec(uri);
  if (!m) throw bad('invalid URI: want mlock://host:port?param=value (no path, no fragment)');
  const o: MlockOptions = {};
  if (m[1] === 'mlocks') o.tls = {};
  let authority = m[2];
  const at = authority.lastIndexOf('@');
  if (at >= 0) {
    const user = authority.slice(0, at);
    authority = authority.slice(at + 1);
    const c = user.indexOf(':');
    if (c <= 0 || c === user.length - 1) throw bad('URI credentials: want mlock://name:token@host');
    o.name = decodeURIComponent(user.slice(0, c));
    o.token = decodeURIComponent(user.slice(c + 1));
  }
  const hosts = authority.split(',');
  if (hosts.length === 1) {
    if (hosts[0] !== '') {
      const a = splitAddr(hosts[0], DEFAULT_PORT);
      o.host = a.host;
      o.port = a.port;
    }
  } else {
    o.addrs = hosts.map((h, i) => {
      if (!h) throw bad(`invalid URI: address ${i + 1} of ${hosts.length} is empty`);
      return splitAddr(h, DEFAULT_PORT).addr;
    });
  }
  for (const [k, v] of new URLSearchParams(m[4] ?? '')) {
    switch (k) {
      case 'ttl':
        o.ttl = parseMs(k, v);
        break;
      case 'timeout':
        o.timeout = parseMs(k, v);
        break;
      case 'tolerate':
        o.tolerate = parseCount(k, v);
        break;
      case 'prefix':
        o.prefix = v;
        break;
      case 'socketId':
        o.socketId = v;
        break;
      case 'debug':
        o.debug = v === '1' || v === 'true';
        break;
      case 'stay-on-node':
        if (v === '1' || v === 'true') o.stayOnNode = true;
        else if (v === '0' || v === 'false') o.stayOnNode = false;
        else throw bad(`URI parameter stay-on-node=${JSON.stringify(v)}: want 1 or 0`);
        break;
      case 'tls':
        if (v === '1' || v === 'true') o.tls = o.tls ?? {};
        else if (v === '0' || v === 'false') delete o.tls;
        else throw bad(`URI parameter tls=${JSON.stringify(v)}: want 1 or 0`);
        break;
      case 'tls-ca':
      case 'tls-cert':
      case 'tls-key': {
        // PEM files, read now; a tls-* parameter implies TLS.
        let pem: Buffer;
        try {
          pem = readFileSync(v);
        } catch (e) {
          throw new MlockError(`URI parameter ${k}: ${(e as Error).message}`, 'request', { cause: e });
        }
        o.tls = { ...(o.tls ?? {}), [k === 'tls-ca' ? 'ca' : k === 'tls-cert' ? 'cert' : 'key']: pem };
        break;
      }
      case 'tls-server-name':
        o.tls = { ...(o.tls ?? {}), servername: v };
        break;
      default:
        throw bad(`unknown URI parameter ${JSON.stringify(k)}`);
    }
  }
  return o;
}

/** Applies the URI and the defaults, and checks everything. */
export function resolve(input: string | MlockOptions): Resolved {
  let o: MlockOptions = typeof input === 'string' ? { uri: input } : { ...input };
  if (o.uri !== undefined) {
    const u = parseURI(o.uri);
    o = { ...o, ...u };
    if (u.addrs) delete o.host;
  }
  if (o.ttl !== undefined && (parseMs('ttl', o.ttl) < 1)) throw bad('ttl should be a whole number of milliseconds > 0');
  const prefix = o.prefix ?? '';
  if (/[| ]/.test(prefix)) throw bad('prefix can not include "|" or " "');
  if ((o.name === undefined) !== (o.token === undefined)) throw bad('name and token go together');
  if (o.name !== undefined && (!o.name || /[:\s]/.test(o.name))) throw bad('invalid name');
  if (o.token !== undefined && (!o.token || /\s/.test(o.token))) throw bad('invalid token');
  if (o.tls && (o.tls.cert === undefined) !== (o.tls.key === undefined)) throw bad('tls-cert and tls-key go together');
  if (o.socketId !== undefined && (!o.socketId || /[\s\0]/.test(o.socketId))) throw bad('invalid socketId');
  let addrs: Resolved['addrs'];
  const port = o.port ?? DEFAULT_PORT;
  if (o.addrs && o.addrs.length > 0) {
    if (o.host !== undefined && o.uri === undefined) throw bad('give host or addrs, not both');
    addrs = o.addrs.map((a) => splitAddr(a, port));
    const seen = new Set<string>();
    for (const a of addrs) {
      if (seen.has(a.addr)) throw bad(`address ${a.addr} given twice`);
      seen.add(a.addr);
    }
  } else {
    const host = o.host ?? 'localhost';
    addrs = [splitAddr(host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`, port)];
  }
  return {
    addrs,
    prefix,
    ttl: o.ttl === undefined ? 60000 : parseMs('ttl', o.ttl),
    timeout: o.timeout === undefined ? 0 : parseMs('timeout', o.timeout),
    tolerate: o.tolerate === undefined ? 0 : parseCount('tolerate', o.tolerate),
    socketId: o.socketId,
    debug: !!o.debug,
    name: o.name,
    token: o.token,
    tls: o.tls,
    dialTimeout: o.dialTimeout === undefined ? 5000 : Math.max(1, parseMs('dialTimeout', o.dialTimeout)),
    pingInterval: o.pingInterval === undefined ? 20000 : Math.max(1, parseMs('pingInterval', o.pingInterval)),
    maxBackoff: o.maxBackoff === undefined ? 5000 : Math.max(1, parseMs('maxBackoff', o.maxBackoff)),
    stayOnNode: !!o.stayOnNode,
  };
}
