import { EventEmitter } from 'node:events';
import { MlockError } from './errors';
import { validName, validOwner } from './rules';
import { resolve, type MlockOptions, type Resolved } from './options';
import { Lock, Session, acquireSession, mono, nameSet, releaseSession, unanswered, type CallCtx, type Reply } from './session';

/** Options of one lock request; every field defaults to the client's. */
export interface LockOptions {
  /** The lease, ms. Default: the client's ttl (60000). */
  ttl?: number;
  /** The longest wait, ms, enforced by the server; 0: no limit. Default: the client's timeout (0). Not for tryLock. */
  timeout?: number;
  /** N > 0 fails at once (type `tolerate`) when a queue already holds more than N entries; 0: no limit. Not for tryLock. */
  tolerate?: number;
  /**
   * An owner makes the lock re-entrant for it (asking again for exactly the
   * same resources renews the lease and returns the same lock) and lets
   * release, releaseAll and renew find it. `*` is the anonymous owner:
   * recorded, never re-entrant. Not empty, no space or `|` (the rule of
   * resource names: tabs and other characters are allowed).
   */
  owner?: string;
  /** Gives up the wait (or the call) when aborted: the request leaves the server's queues. */
  signal?: AbortSignal;
  /**
   * Unix ms (`Date.now()`) at which the call gives up if it has not settled,
   * the wait for a connection included: as a signal that aborts then (the
   * request leaves the server's queues), it fails with type `timeout`, reason
   * `deadline`. It costs a timer, where an `AbortSignal.timeout()` given as
   * signal costs tens of µs a call in Node.js 20.
   */
  deadline?: number;
}

/** The options of the calls other than lock requests. */
export interface CallOptions {
  /** Gives up the call when aborted (type `canceled`). */
  signal?: AbortSignal;
  /** Unix ms at which the call gives up (type `timeout`, reason `deadline`); see {@link LockOptions.deadline}. */
  deadline?: number;
}

/** Options of {@link Mlock.execute}. */
export interface ExecuteOptions extends LockOptions {
  /** Called when a renewal fails for a reason other than the loss (connection trouble; retried at the next third of the lease). */
  onRenewError?: (err: unknown) => void;
}

/** The server's status (the original fields, and mlockd's additions). */
export interface Status {
  socketCount: number;
  currentLocks: number;
  liveTime: number;
  startAt?: number;
  lockCount?: number;
  [field: string]: unknown;
}

/** What {@link Mlock.renew} returns. */
export interface Renewal {
  /** The new expiry, Unix ms on the server's clock. */
  expiresAt: number;
  /** The lock's fencing token (unchanged by renewals). */
  token: number;
}

/**
 * How many execute calls run on each lock: an owner's execute that re-enters
 * a lock held by another execute of this process gets the same handle, and
 * the lock is unlocked only when the last of them ends (the first to end
 * would otherwise unlock it under the others' jobs, which would run on
 * without the lock and without being told).
 */
const executing = new WeakMap<Lock, number>();

/** The lock a lock request's reply carries. */
const lockOf = (r: Reply): Lock => r.lock!;

function request(msg: string): MlockError {
  return new MlockError(msg, 'request');
}

function checkInt(name: string, v: number, min: number): void {
  if (!Number.isInteger(v) || v < min) throw request(`${name} should be a whole number >= ${min}, not ${v}`);
}

/** Names an older server's refusal of a scoped release (it released nothing). */
function scopeError(e: unknown): unknown {
  if (e instanceof MlockError && e.reason === 'invalid message!') {
    return new MlockError('the server does not support scoped releases (releasein, releaseallin)', 'request', { reason: e.reason, node: e.node, cause: e });
  }
  return e;
}

function checkOwner(owner: string): void {
  if (!validOwner(owner)) throw request(`invalid owner ${JSON.stringify(owner)}`);
}

/**
 * A client of mlockd (or of the original mlock server, for the 1.0 commands).
 * Every client of the same address (or set of cluster nodes), credentials and
 * TLS setting in a process shares one session: one socketId and one
 * connection that reconnects by itself with the same socketId (to the next
 * node of a cluster) and keeps the session's locks across reconnects.
 *
 * Events: `'lost'` (err, lock) when a held lock is lost; `'connect'` (node,
 * resumed), `'reconnect'` (node, resumed), `'disconnect'` (node, err).
 */
export class Mlock extends EventEmitter {
  /** The options with defaults applied. */
  readonly options: Readonly<Resolved>;
  private readonly s: Session;
  private destroyed = false;

  /**
   * @param options an `mlock://host:port?ttl=&timeout=&tolerate=&prefix=&socketId=` URI
   * (several nodes: `mlock://h1:12340,h2:12340,h3:12340`; TLS: `mlocks://`;
   * credentials: `mlock://name:token@host`), or an options object.
   * Throws an MlockError of type `request` on bad options. Does not wait for the connection.
   */
  constructor(options: string | MlockOptions = {}) {
    super();
    this.options = resolve(options);
    this.s = acquireSession(this.options);
    this.s.listeners.add(this);
  }

  /** The session id (shared by the clients of the same address). */
  get socketId(): string {
    return this.s.sid;
  }

  /** The address of the node connected to, or '' while disconnected. */
  get node(): string {
    return this.s.node;
  }

  /** Throws if this client is destroyed. */
  private check(): void {
    if (this.destroyed) throw new MlockError('client destroyed', 'connection', { reason: 'destroyed' });
  }

  private names(resources: string | string[]): string {
    this.check();
    const p = this.options.prefix;
    if (typeof resources === 'string' && resources.indexOf('|') < 0) {
      // One resource (the common case): no list to build.
      if (!validName(resources)) throw request(`resource can not be empty or include " " or "|": ${JSON.stringify(resources)}`);
      return p ? p + resources : resources;
    }
    const list = Array.isArray(resources) ? resources : String(resources).split('|');
    if (list.length === 0) throw request('no resource');
    for (const n of list) {
      if (!validName(n)) {
        throw request(`resource can not be empty or include " " or "|": ${JSON.stringify(n)}`);
      }
    }
    return p ? list.map((n) => p + n).join('|') : list.join('|');
  }

  private newLock(verb: 'lock' | 'trylock', resources: string | string[], o: LockOptions): Promise<Lock> {
    let res: string;
    try {
      res = this.names(resources);
      const ttl = o.ttl ?? this.options.ttl;
      checkInt('ttl', ttl, 1);
      const args = [res, String(ttl)];
      let timeout = 0;
      if (verb === 'lock') {
        timeout = o.timeout ?? this.options.timeout;
        const tolerate = o.tolerate ?? this.options.tolerate;
        checkInt('timeout', timeout, 0);
        checkInt('tolerate', tolerate, 0);
        args.push(String(timeout), String(tolerate));
      }
      if (o.owner !== undefined) {
        checkOwner(o.owner);
        args.push(o.owner);
      }
      const l = new Lock(this.s, this, verb, args, ttl, timeout, o.owner);
      // An owner's re-entry renews its held lock to this ttl.
      const bounds = o.owner !== undefined ? this.s.shortenOwned(o.owner, res, mono(), ttl) : undefined;
      const call = this.s.call(verb, args, o.signal, l, o.deadline === undefined ? undefined : { deadline: o.deadline });
      if (!bounds?.length) return call.then(lockOf);
      return call.then(lockOf, (e: unknown) => {
        this.s.unshorten(bounds, e);
        throw e;
      });
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Waits until it holds every resource of `a|b|c` (the prefix applies to
   * each) and returns the lock id, as the original client. Fails with an
   * MlockError of type `tolerate`, `timeout`, `request`, `connection` or
   * `canceled` (opts.signal). `ttl`, `timeout` (0: no limit), `tolerate`
   * default to the client's options. {@link getLock} gives the lock's handle.
   */
  async lock(resource: string, ttl?: number, timeout?: number, tolerate?: number, opts: { owner?: string; signal?: AbortSignal; deadline?: number } = {}): Promise<string> {
    if (typeof resource === 'string' && resource.includes(' ')) throw request('resource can not includes " "');
    const l = await this.newLock('lock', resource, { ttl, timeout, tolerate, ...opts });
    return l.id;
  }

  /**
   * Waits until it holds every resource (`'a|b'` or `['a', 'b']`) and returns
   * the lock: its id, fencing token, expiry, deadline, `'lost'` event. Errors
   * as {@link lock}. An owner asking again for exactly the resources it holds
   * gets its held lock back, renewed.
   */
  acquire(resources: string | string[], opts: LockOptions = {}): Promise<Lock> {
    return this.newLock('lock', resources, opts);
  }

  /**
   * Takes the lock only if it can be granted at once; otherwise fails with an
   * MlockError of type `tolerate` whose reason is `resource is locked!` and
   * whose `resource` names a resource that is taken.
   */
  tryLock(resources: string | string[], opts: Omit<LockOptions, 'timeout' | 'tolerate'> = {}): Promise<Lock> {
    return this.newLock('trylock', resources, opts);
  }

  /** The handle of a lock this process holds or waits for, by id. */
  getLock(lockId: string): Lock | undefined {
    return this.s.locks.get(lockId);
  }

  /**
   * Sets the lease of a lock to now + ttl (default: the lock's ttl for a lock
   * of this process, else the client's) and returns the new expiry (Unix ms,
   * server clock). A lock of this process that the server no longer has is
   * lost (type `lost`); an unknown id is refused (type `request`, `lock not exist!`).
   */
  async extend(lockId: string, ttl?: number, opts: CallOptions = {}): Promise<number> {
    const l = this.s.locks.get(lockId);
    if (l) return l.extend(ttl, opts);
    this.check();
    const t = ttl ?? this.options.ttl;
    checkInt('ttl', t, 1);
    const r = await this.s.retry('extend', [lockId, String(t)], opts.signal, { client: this, deadline: opts.deadline });
    return Number(r.payload);
  }

  /** Releases a lock by id (held or waiting). */
  async unlock(lockId: string, opts: CallOptions = {}): Promise<void> {
    const l = this.s.locks.get(lockId);
    if (l) return l.unlock(opts);
    this.check();
    await this.s.retry('unlock', [lockId], opts.signal, { client: this, deadline: opts.deadline });
  }

  /**
   * Runs fn while holding the lock: acquires it, extends the lease every
   * ttl/3 while fn runs, aborts fn's signal (reason: the loss) as soon as the
   * lock is lost or at its deadline, and unlocks when fn settles. Returns fn's
   * result; throws fn's error, or the loss (type `lost`) if the lock was lost
   * even if fn returned. Executes of one owner that re-enter the same lock in
   * this process share it: it is unlocked when the last of them settles.
   */
  async execute<T>(resources: string | string[], fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T, opts: ExecuteOptions = {}): Promise<T> {
    const lock = await this.acquire(resources, opts);
    executing.set(lock, (executing.get(lock) ?? 0) + 1);
    let timer: NodeJS.Timeout | undefined;
    let done = false;
    const renew = () => {
      timer = setTimeout(async () => {
        if (done || !lock.held) return;
        try {
          await lock.extend();
        } catch (e) {
          if (e instanceof MlockError && e.type === 'lost') return;
          opts.onRenewError?.(e);
        }
        if (!done && lock.held) renew();
      }, Math.max(lock.ttl / 3, 1));
      timer.unref();
    };
    renew();
    let failed = false;
    try {
      // Lost already (a loss read with the grant): fn does not run without the lock.
      if (!lock.held) throw lock.error ?? new MlockError('lock lost', 'lost');
      const r = await fn(lock.signal, lock);
      if (lock.error) throw lock.error;
      return r;
    } catch (e) {
      failed = true;
      if (lock.error && e !== lock.error) throw new MlockError(lock.error.message, 'lost', { reason: lock.error.reason, cause: e });
      throw e;
    } finally {
      done = true;
      clearTimeout(timer);
      const others = (executing.get(lock) ?? 1) - 1;
      if (others > 0) executing.set(lock, others);
      else executing.delete(lock);
      try {
        // Another execute still runs on this lock: it unlocks when it ends.
        if (others === 0) await lock.unlock();
      } catch (e) {
        // The lease ran out just as fn returned: it did not hold the lock throughout.
        if (!failed && e instanceof MlockError && e.type === 'lost') throw e;
      }
    }
  }

  /**
   * Releases, for each resource of `a|b`, the lock owner holds on it, and
   * reports whether every one was held by owner; others' locks are untouched.
   * A lock released only in part is lost for its holder. With `scope` (see
   * {@link releaseAll}) a resource outside it is left alone, and the answer is
   * then false.
   */
  async release(owner: string, resources: string | string[], opts: CallOptions & { scope?: string } = {}): Promise<boolean> {
    const res = this.names(resources);
    checkOwner(owner);
    const scope = this.scopeOf(opts.scope);
    const ctx: CallCtx = { client: this, deadline: opts.deadline };
    try {
      const r = scope ? await this.s.call('releasein', [owner, res, scope], opts.signal, undefined, ctx) : await this.s.call('release', [owner, res], opts.signal, undefined, ctx);
      return r.payload === 'true';
    } catch (e) {
      // Sent but not answered: it may have freed this session's held locks of
      // owner, and the server's word of it was lost with the answer.
      if (ctx.sent && unanswered(e)) this.s.mayBeReleased(owner, res);
      throw scopeError(e);
    }
  }

  /**
   * Releases every lock owner holds; returns how many. An owner is one for
   * the whole server: without `scope` this reaches its locks on every
   * resource, whatever the prefix. With `scope` (a string, `''` included) it
   * releases only the owner's resources whose names start with the prefix
   * followed by scope, and counts the locks it released wholly or in part:
   * an owner's locks outside (another namespace's, an `mlock run` of the same
   * owner) are never touched. A scoped release needs a server that knows
   * `releaseallin`; an older one refuses it (type `request`) and releases
   * nothing.
   */
  async releaseAll(owner: string, opts: CallOptions & { scope?: string } = {}): Promise<number> {
    this.check();
    checkOwner(owner);
    const scope = this.scopeOf(opts.scope);
    const ctx: CallCtx = { client: this, deadline: opts.deadline };
    try {
      const r = scope ? await this.s.call('releaseallin', [owner, scope], opts.signal, undefined, ctx) : await this.s.call('releaseall', [owner], opts.signal, undefined, ctx);
      return Number(r.payload);
    } catch (e) {
      if (ctx.sent && unanswered(e)) this.s.mayBeReleased(owner, undefined);
      throw scopeError(e);
    }
  }

  /** The wire scope of a release: undefined (none) or the prefix then scope; '' means none. */
  private scopeOf(scope: string | undefined): string {
    if (scope === undefined) return '';
    const s = (this.options.prefix ?? '') + scope;
    if (/[ |]/.test(s)) throw request(`invalid scope ${JSON.stringify(s)}`);
    return s;
  }

  /**
   * Sets the lease of the lock owner holds on exactly these resources (any
   * order) to now + ttl, whichever session holds it. Fails with type
   * `request`, reason `lock not exist!`, if owner holds no such lock. A
   * handle of this process holding that very lock has its lease moved too.
   */
  async renew(owner: string, resources: string | string[], ttl?: number, opts: CallOptions = {}): Promise<Renewal> {
    const res = this.names(resources);
    checkOwner(owner);
    const t = ttl ?? this.options.ttl;
    checkInt('ttl', t, 1);
    const bounds = this.s.shortenOwned(owner, res, mono(), t);
    let r;
    try {
      r = await this.s.retry('renew', [owner, res, String(t)], opts.signal, { client: this, deadline: opts.deadline });
    } catch (e) {
      this.s.unshorten(bounds, e);
      throw e;
    }
    const [exp, tok] = r.payload.split(' ');
    const out = { expiresAt: Number(exp), token: Number(tok) };
    const set = nameSet(res);
    for (const l of this.s.locks.values()) {
      if (l.held && l.owner === owner && l.token === out.token && nameSet(l.resources) === set) {
        l.renewed(r.sent, t, out.expiresAt);
      }
    }
    return out;
  }

  /** Pings the server; resolves `'pong'`. */
  async ping(opts: CallOptions = {}): Promise<'pong'> {
    this.check();
    await this.s.retry('ping', [], opts.signal, { client: this, deadline: opts.deadline });
    return 'pong';
  }

  /** The server's status (of the node that answered). */
  async status(opts: CallOptions = {}): Promise<Status> {
    this.check();
    const r = await this.s.retry('status', [], opts.signal, { client: this, deadline: opts.deadline });
    try {
      return JSON.parse(r.payload) as Status;
    } catch (e) {
      throw new MlockError('invalid status', 'request', { cause: e });
    }
  }

  /**
   * Releases this client: its locks are unlocked on the server (best
   * effort), its held locks lost (type `lost`, reason `destroyed`), its waits
   * failed (type `connection`). The shared connection closes with the last
   * client of its address; other clients are not disturbed. Idempotent.
   */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.s.detach(this);
    this.s.listeners.delete(this);
    releaseSession(this.s);
  }
}
