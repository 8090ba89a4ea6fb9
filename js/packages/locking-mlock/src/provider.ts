import { randomUUID } from 'node:crypto';
import { MedusaError } from '@medusajs/framework/utils';
import type { ILockingProvider, Logger } from '@medusajs/framework/types';
import Mlock, { type Lock, MlockError, type MlockOptions } from 'mlock';

/** Options of the provider (the `options` of its entry in medusa-config). */
export interface MlockLockingOptions {
  /**
   * The server: `mlock://host:12340`, several nodes of a cluster
   * (`mlock://h1:12340,h2:12340,h3:12340`), TLS (`mlocks://`), credentials
   * (`mlock://name:token@host`). Default `mlock://localhost:12340`.
   */
  url?: string;
  /** Further client options (dialTimeout, tls, ...); `url` wins. */
  clientOptions?: MlockOptions;
  /** Put before every key, as locking-redis's namespace. Default `medusa_lock:`. */
  namespace?: string;
  /** Seconds `execute` waits for the lock when the call gives no timeout. Default 5. */
  waitLockingTimeout?: number;
  /**
   * Seconds an `acquire` without `expire` lasts (mlockd has no endless lease). It must be within
   * mlockd's --max-ttl (24 h by default): a longer lease is refused. Default 86400.
   */
  maxExpire?: number;
}

/** The lease of `execute` when the call gives no `expire`, seconds (as locking-redis). */
const DEFAULT_LOCK_EXPIRATION = 60;

/** Keys may hold any character; mlockd names hold no space or `|`. */
const encodeKey = (k: string) => (/[% |]/.test(k) ? k.replace(/%/g, '%25').replace(/ /g, '%20').replace(/\|/g, '%7C') : k);
const decodeKey = (k: string) => (k.includes('%') ? k.replace(/%7C/g, '|').replace(/%20/g, ' ').replace(/%25/g, '%') : k);

/**
 * The pause between two tries of a call while the server is unreachable. Not
 * unref'd: between two tries the client may hold nothing open (its round of
 * dials failed), and a process awaiting execute or acquire must not exit
 * with the call pending.
 */
const pause = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Whether e ends a call at the deadline its caller gave: the client's (type
 * timeout, reason deadline), or the abort of untilConnected's signal.
 */
function gaveUp(e: MlockError): boolean {
  if (e.type === 'timeout') return e.reason === 'deadline';
  return e.type === 'canceled' && e.cause instanceof MlockError && e.cause.reason === 'deadline';
}

/** `() =>` or `async () =>` at the start of a function's source. */
const NO_PARAMS_ARROW = /^(?:async\s*)?\(\s*\)\s*=>/;

/**
 * Whether job may read the signal execute passes it: false only for an arrow
 * function declared without parameters (`async () => ...`), which has no way
 * to see its arguments. Making an AbortSignal costs about 20 µs of CPU in
 * Node.js 20, more than the rest of an uncontended execute; the interface
 * types the signal as optional. A function with parameters, rest parameters,
 * or the `function` keyword (which may read `arguments`) gets one.
 */
export function takesSignal(job: (...args: never[]) => unknown): boolean {
  return job.length > 0 || !NO_PARAMS_ARROW.test(Function.prototype.toString.call(job));
}

/** A MedusaError (what locking-redis throws) whose cause is ours. */
function medusaError(type: string, message: string, cause: unknown): MedusaError {
  const e = new MedusaError(type, message);
  if (cause !== undefined) Object.defineProperty(e, 'cause', { value: cause, configurable: true, writable: true });
  return e;
}

/** The error of a release while the server stays unreachable. */
function unreachable(last: unknown): MedusaError {
  const why = last instanceof Error ? last.message : 'no connection';
  return medusaError(MedusaError.Types.UNEXPECTED_STATE, `The lock server is unreachable: ${why}`, last);
}

/**
 * Why a held lock is gone, for the job's abort reason: the real cause, and
 * the advice to raise "expire" only when the lease ran out.
 */
export function lossCause(e: MlockError): string {
  switch (e.reason) {
    case 'shutdown':
      return `the lock server shut down (${e.message}).`;
    case 'evicted':
      return `an administrator evicted it (${e.message}).`;
    case 'released':
      return `it was released by its owner elsewhere (${e.message}).`;
    case 'session lost':
      return `the connection to the lock server was lost (${e.message}).`;
    case 'destroyed':
      return 'the provider was shut down.';
    default:
      if (/without word/.test(e.message)) return `the lock server could not be reached until the lease ran out (${e.message}).`;
      return `the lease ended before it could be renewed (${e.message}). Increase "expire" if the job is expected to run this long.`;
  }
}

/** A registration of an awilix cradle, undefined if it has none (the cradle throws). */
function pick<T, K extends keyof T>(cradle: T, key: K): T[K] | undefined {
  try {
    return cradle?.[key];
  } catch {
    return undefined;
  }
}

function num(v: unknown): number | undefined {
  return v === undefined || v === null || v === '' || Number.isNaN(+v) ? undefined : +v;
}

/** What execute's job learns of its lock (its second argument). */
export interface ExecuteLease {
  /** The fencing token of the grant: pass it to the writes the job makes (mlock's fencedTransaction). */
  token: number;
  /** The resources locked, as mlockd names them ('a|b', the provider's prefix and key encoding applied). */
  resources: string;
}

/**
 * The mlockd locking provider for Medusa's Locking Module. Every call is one
 * request to mlockd: a multi-key acquisition takes every key or none, in one
 * step, and waits in the server's FIFO queues (no polling, no deadlock
 * between callers asking for the same keys in any order); execute renews its
 * lease every third of it and aborts the job's signal as soon as the lock is
 * lost. See the package README for every difference from locking-redis.
 */
export class MlockLockingProvider implements ILockingProvider {
  static identifier = 'locking-mlock';

  protected readonly logger_?: Logger;
  protected readonly options_: MlockLockingOptions;
  protected readonly prefix: string;
  protected readonly waitLockingTimeout: number = 5;
  protected readonly maxExpire: number = 86400;
  private client_?: Mlock;
  /** The owners of execute: this id (random, of this provider) and a count. */
  private readonly executeId = randomUUID();
  private executes = 0;

  /**
   * @param cradle the provider's container: its loader registers the
   * provider's options as `mlockLockingOptions`
   * @param options used when the container has none (the provider built by hand)
   */
  constructor(cradle: { logger?: Logger; mlockLockingOptions?: MlockLockingOptions } = {}, options: MlockLockingOptions = {}) {
    this.logger_ = pick(cradle, 'logger');
    this.options_ = pick(cradle, 'mlockLockingOptions') ?? options ?? {};
    this.prefix = this.options_.namespace ?? 'medusa_lock:';
    const w = num(this.options_.waitLockingTimeout);
    if (w !== undefined) this.waitLockingTimeout = w;
    const m = num(this.options_.maxExpire);
    if (m !== undefined && m > 0) this.maxExpire = m;
    // Check the options now, connect on first use (a migration run opens no socket).
    this.makeClient().destroy();
  }

  private makeClient(): Mlock {
    const o: MlockOptions = { ...(this.options_.clientOptions ?? {}), prefix: this.prefix };
    o.uri = this.options_.url ?? this.options_.clientOptions?.uri ?? 'mlock://localhost:12340';
    return new Mlock(o);
  }

  /** The client, made on first use. */
  protected get client(): Mlock {
    if (!this.client_) this.client_ = this.makeClient();
    return this.client_;
  }

  private keys(keys: string | string[]): string[] {
    const list = Array.isArray(keys) ? keys : [keys];
    if (list.length === 0) throw new MedusaError(MedusaError.Types.INVALID_DATA, 'No key to lock.');
    return list.map((k) => {
      if (typeof k !== 'string' || k === '') throw new MedusaError(MedusaError.Types.INVALID_DATA, `Invalid lock key ${JSON.stringify(k)}.`);
      return encodeKey(k);
    });
  }

  /** The key a refusal names, without the namespace. */
  private keyOf(e: MlockError, keys: string[]): string {
    const r = e.resource && e.resource.startsWith(this.prefix) ? e.resource.slice(this.prefix.length) : keys[0];
    return decodeKey(r);
  }

  private conflict(e: unknown, keys: string[]): unknown {
    if (e instanceof MlockError && (e.reason === 'resource is locked!' || e.reason === 'owner holds an overlapping lock!')) {
      return medusaError(MedusaError.Types.CONFLICT, `Failed to acquire lock for key "${this.keyOf(e, keys)}"`, e);
    }
    return e;
  }

  /**
   * Runs call until it settles with anything but a connection error, while
   * the server is unreachable (stopped, restarting, a failover) retrying
   * until `ms` have passed since start; then throws onTimeout(the last
   * error). call gets what is left of the time, in ms, and the deadline
   * (Unix ms) to give the client: the call gives up then. locking-redis
   * behaves alike: ioredis holds its commands while it reconnects, so a
   * blip of the server costs a wait, not a failure.
   */
  private async whileUnreachable<T>(start: number, ms: number, call: (left: number, deadline: number) => Promise<T>, onTimeout: (last: unknown) => unknown): Promise<T> {
    let wait = 25;
    let last: unknown;
    const deadline = start + ms;
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) throw onTimeout(last);
      try {
        return await call(left, deadline);
      } catch (e) {
        if (!(e instanceof MlockError)) throw e;
        if (gaveUp(e)) {
          // Out of time: still waiting for a connection, or for the server.
          const why = last ?? (this.client.node ? e : new MlockError(`no connection to the lock server within ${ms} ms`, 'connection', { cause: e }));
          throw onTimeout(why);
        }
        if (e.type !== 'connection' || e.reason === 'destroyed') throw e;
        last = e;
      }
      await pause(Math.min(wait, Math.max(start + ms - Date.now(), 0)));
      wait = Math.min(wait * 2, 250);
    }
  }

  /**
   * Runs job while holding every key: waits at most `timeout` seconds
   * (default waitLockingTimeout, at least 1) in the keys' queues under an
   * owner of its own, holds a lease of `expire` seconds (default 60, at least
   * 1) renewed every third of it while the job runs, aborts the job's signal
   * (reason: a MedusaError CONFLICT) if the lock is lost and then throws that
   * error, and releases when the job settles. The job's second argument is
   * the lease it runs under: its fencing token (`lease.token`, to fence its
   * writes: mlock's fencedTransaction) and its resources (`lease.resources`,
   * the keys as locked, 'a|b'); Medusa's interface passes no arguments, so a
   * job written for it ignores them.
   */
  async execute<T>(keys: string | string[], job: (signal?: AbortSignal, lease?: ExecuteLease) => Promise<T>, args?: { timeout?: number; expire?: number }): Promise<T> {
    // As locking-redis: at least 1 s; a timeout that is not a number is 1 s.
    const timeout = args?.timeout === undefined || args?.timeout === null ? Math.max(this.waitLockingTimeout, 1) : Math.max(num(args.timeout) ?? 1, 1);
    const expire = Math.max(num(args?.expire) ?? DEFAULT_LOCK_EXPIRATION, 1);
    const list = this.keys(keys);
    // One key goes as it is (the client's path without a list).
    const res = list.length === 1 ? list[0] : list;
    // An owner no other call has: the provider's random id and a count.
    const owner = `execute:${this.executeId}:${(++this.executes).toString(36)}`;
    const timedOut = (cause: unknown) => medusaError(MedusaError.Types.CONFLICT, 'Timed-out acquiring lock.', cause);
    let lock: Lock;
    try {
      // The server's own timeout, and the caller's: the wait for a server
      // that is unreachable counts too.
      lock = await this.whileUnreachable(Date.now(), Math.round(timeout * 1000), (left, deadline) =>
        this.client.acquire(res, { owner, ttl: Math.round(expire * 1000), timeout: Math.max(left, 1), deadline }), timedOut);
    } catch (e) {
      if (e instanceof MlockError && e.type === 'timeout') throw timedOut(e);
      throw this.conflict(e, list);
    }
    const names = () => list.map(decodeKey).join('", "');
    // A job that cannot read a signal gets none (see takesSignal).
    const ac = takesSignal(job) ? new AbortController() : undefined;
    let lost: MedusaError | undefined;
    const onLost = (e: MlockError) => {
      const message = `Lost the lock for key(s) "${names()}" while the job was still running: ${lossCause(e)}`;
      this.logger_?.warn(message);
      lost = medusaError(MedusaError.Types.CONFLICT, message, e);
      ac?.abort(lost);
    };
    lock.on('lost', onLost); // fires at most once: a lock is lost once
    // Lost already (a loss read with the grant, before the listener was
    // there): the job does not run without the lock.
    if (!lock.held && !lost) onLost(lock.error ?? new MlockError('lock lost', 'lost'));
    const interval = Math.max(Math.floor((expire * 1000) / 3), 250);
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const schedule = () => {
      timer = setTimeout(async () => {
        try {
          await lock.extend();
        } catch (e) {
          // A loss fires 'lost'; anything else (the connection) is retried.
          if (!(e instanceof MlockError && e.type === 'lost') && !stopped) {
            this.logger_?.warn(`Failed to renew lock for key(s) "${names()}": ${(e as Error).message}. Retrying in ${interval}ms.`);
          }
        }
        if (!stopped && lock.held) schedule();
      }, interval);
      timer.unref();
    };
    schedule();
    try {
      if (lost) throw lost;
      const result = await job(ac?.signal, { token: lock.token, resources: lock.resources });
      // A job that kept the event loop busy past the lock's deadline: the
      // timer that loses it could not run; reading held loses it ('lost').
      if (!lock.held || lost) throw lost ?? medusaError(MedusaError.Types.CONFLICT, `Lost the lock for key(s) "${names()}" while the job was still running.`, lock.error);
      return result;
    } finally {
      stopped = true;
      clearTimeout(timer);
      lock.off('lost', onLost);
      await lock.unlock().catch(() => undefined);
    }
  }

  /**
   * Takes every key or none for ownerId (default `*`, the anonymous owner,
   * never re-entrant). The same owner asking again for exactly the keys it
   * holds renews the lease to `expire`. Without awaitQueue a key held by
   * another owner fails at once with a MedusaError CONFLICT naming it; with
   * awaitQueue the call waits in the keys' queues until it gets all of them.
   * Without expire the lock lasts maxExpire (default 24 h).
   */
  async acquire(keys: string | string[], args?: { ownerId?: string | null; expire?: number; awaitQueue?: boolean }): Promise<void> {
    const list = this.keys(keys);
    const owner = encodeKey(args?.ownerId ?? '*');
    const e = num(args?.expire);
    const ttl = Math.round((e ? Math.max(e, 0.001) : this.maxExpire) * 1000);
    // An unreachable server is waited for up to waitLockingTimeout; a queue
    // (awaitQueue) is waited in without limit, as locking-redis.
    const ms = Math.max(this.waitLockingTimeout, 1) * 1000;
    const timedOut = (cause: unknown) => medusaError(MedusaError.Types.CONFLICT, 'Timed-out acquiring lock.', cause);
    const start = Date.now();
    try {
      await this.whileUnreachable(start, ms, (_left, deadline) => {
        if (!args?.awaitQueue) return this.client.tryLock(list, { owner, ttl, deadline });
        // The deadline bounds the wait for the connection, not the queue.
        if (this.client.node) return this.client.acquire(list, { owner, ttl });
        return this.client.acquire(list, { owner, ttl, signal: this.untilConnected(deadline) });
      }, timedOut);
    } catch (err) {
      throw this.conflict(err, list);
    }
  }

  /**
   * A signal that aborts at deadline (Unix ms) if the client has not been
   * connected since the call began, and never once it has: it bounds the
   * wait for a connection, not the wait in the queues (see gaveUp). A
   * connection that drops while the request waits in a queue (sent) does
   * not end the wait: the resumed session asks again.
   */
  private untilConnected(deadline: number): AbortSignal {
    const ac = new AbortController();
    const up = () => {
      clearTimeout(timer);
      this.client.off('connect', up);
      this.client.off('reconnect', up);
    };
    const timer = setTimeout(() => {
      up();
      if (!this.client.node) ac.abort(new MlockError('call given up at its deadline', 'timeout', { reason: 'deadline' }));
    }, Math.max(deadline - Date.now(), 0));
    timer.unref();
    this.client.on('connect', up);
    this.client.on('reconnect', up);
    return ac.signal;
  }

  /** Releases ownerId's (default `*`) lock on each key; true only if ownerId held every one. */
  async release(keys: string | string[], args?: { ownerId?: string | null }): Promise<boolean> {
    const list = this.keys(keys);
    const owner = encodeKey(args?.ownerId ?? '*');
    return this.whileUnreachable(Date.now(), Math.max(this.waitLockingTimeout, 1) * 1000, (_l, deadline) => this.client.release(owner, list, { deadline }), unreachable);
  }

  /**
   * Releases every lock of ownerId (default `*`: the anonymous locks, as
   * locking-redis) in the provider's namespace: an owner's locks outside it
   * (another namespace's, an `mlock run`) are never touched.
   */
  async releaseAll(args?: { ownerId?: string | null }): Promise<void> {
    const owner = encodeKey(args?.ownerId ?? '*');
    await this.whileUnreachable(Date.now(), Math.max(this.waitLockingTimeout, 1) * 1000, (_l, deadline) => this.client.releaseAll(owner, { deadline, scope: '' }), unreachable);
  }

  /** Closes the connection (the locks this process holds are released). */
  async shutdown(): Promise<void> {
    this.client_?.destroy();
    this.client_ = undefined;
  }
}
