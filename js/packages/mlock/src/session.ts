import { EventEmitter } from 'node:events';
import * as net from 'node:net';
import * as tls from 'node:tls';
import { createHash, randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { Decoder, encode, encodeAll } from './framing';
import { MlockError, canceled, failure } from './errors';
import type { Resolved } from './options';

// The session: one socketId on one server (or on the nodes of one cluster),
// shared by every client of that address in the process. It owns the one
// connection at a time (reconnecting, to the next node of a cluster), the
// calls in flight, and the waiting and held locks.
//
// The safety rule: a held lock is believed held only until its deadline,
// which the client computes with its own monotonic clock from what the server
// has provably answered: the earlier of (the send time of the request that
// granted or last extended it + ttl) and (the send time of the last request
// answered with success on the session, status excepted, + the session grace
// the server announced), each less a clock-drift margin (span/100 + 5 ms). At
// the deadline the lock is lost (its 'lost' event fires), even if the server
// never said so. A lock request is never believed granted with an id the
// session is giving back or unlocking (see result): the server may have
// renewed that lock by an owner's re-entry just before the unlock frees it.
// Lock requests whose connection drops before their answer are asked again on
// the next connection (see detached, reaskCalls).

/**
 * What plain connections read into: each read is decoded before the next
 * (the frames become strings, a partial frame is copied), so one buffer
 * serves every connection of the process.
 */
const readBuffer = Buffer.allocUnsafe(64 * 1024);

/** Monotonic milliseconds. */
export const mono = (): number => performance.now();

/** The clock-drift margin of a span, ms. */
export const margin = (d: number): number => d / 100 + 5;

/**
 * Two thirds of a span (ms) less its drift margin. A grant must leave this
 * much of the shorter of its ttl and the session grace to believe when it
 * reaches the caller; one that arrives with less is confirmed first (see
 * Lock.granted).
 */
export const minUsable = (span: number): number => ((span - margin(span)) * 2) / 3;

/**
 * The extends that confirm one grant after the first: a grant whose
 * confirmations all come back too late to leave minUsable (every answer
 * held up longer than a third of the span) is never handed over: it is
 * given back and asked again, with what is left of the wait's timeout.
 */
const MAX_CONFIRMS = 2;

/** The shortest keep-alive period, ms. */
const MIN_KEEPALIVE = 5;

/**
 * How many connections a lock request may lose before its result (it is
 * asked again after each but the last): a node that drops every connection
 * fails the request with the connection error instead of keeping it forever.
 */
const MAX_DROPS = 3;

/**
 * How long (ms) a connection must last for the next one to be made at once
 * when it drops; one that drops sooner is followed by the backoff, which
 * grows while connections keep dropping that soon.
 */
const STABLE_CONN = 1000;

/** Where a lock request stands. */
export type LockState = 'waiting' | 'held' | 'released' | 'failed' | 'lost';

/** A reply to a call. */
export interface Reply {
  payload: string;
  /** When the command was queued (monotonic ms). */
  sent: number;
  /** The node that answered. */
  node: string;
  /** lock, trylock: the granted lock (a renewal returns the one held). */
  lock?: Lock;
}

/** A request in flight. A lock request's call lasts until the grant. */
interface Call {
  seq: number;
  verb: string;
  sent: number;
  resolve?: (r: Reply) => void;
  reject?: (e: MlockError) => void;
  lock?: Lock;
  probe?: Lock;
  abandoned?: boolean;
  /** lock, trylock: connections lost with this request in flight. */
  drops?: number;
  /** trylock: asked once more after a busy answer (see Session.result). */
  busyRetried?: boolean;
  /** unlock: the id of the grant it gives back (see Session.forget). */
  giving?: string;
  /** The client that made the call (its destroy fails the call at once). */
  client?: LockOwner;
}

/** What a caller tells Session.call and learns from it. */
export interface CallCtx {
  /** The client making the call: its destroy fails the call at once. */
  client?: LockOwner;
  /** Set once the command is queued on a connection: the server may apply it even if its answer never arrives. */
  sent?: boolean;
  /**
   * Unix ms (Date.now()) at which the call is given up if it has not
   * settled, as if its signal aborted then (see deadlineError).
   */
  deadline?: number;
  /** Unix ms at which a lock's wait timeout ends, counted from its first wait for the connection. */
  lockEnd?: number;
}

/** The error of a lock whose wait timeout ran out while the connection was down: its cause is the connection's error. */
const lockWaitError = (cause: MlockError) =>
  new MlockError("Lock timeout: no connection to the server within the lock's wait timeout", 'timeout', { cause });

/** The error of a call given up at its deadline. */
export const deadlineError = () => new MlockError('call given up at its deadline', 'timeout', { reason: 'deadline' });

/**
 * A renewal of a held lock to a shorter lease, sent at sent or later: if the
 * server applied it, the lease ends at at (its drift margin applied) or later.
 */
export interface Shortening {
  at: number;
  sent: number;
}

/** Whether e is not the server's answer (the connection dropped, or the caller gave up): the command's outcome is unknown. */
export function unanswered(e: unknown): boolean {
  return !(e instanceof MlockError) || e.type === 'connection' || e.type === 'timeout' || e.type === 'canceled';
}

/** The set of names of resources a|b (sorted, without repeats), as a key. */
export function nameSet(res: string): string {
  return [...new Set(res.split('|'))].sort().join('|');
}

/** What a Lock needs of the client that asked for it. */
export interface LockOwner {
  emit(event: 'lost', err: MlockError, lock: Lock): boolean;
}

/**
 * A lock request; a held lock once the client returns it. A held lock is
 * believed held until its {@link Lock.deadline}; it is lost when the server
 * says so (expired, released by its owner, even in part), when the session is
 * lost, or when the deadline passes without word from the server: then the
 * `'lost'` event fires, {@link Lock.lost} resolves, {@link Lock.signal}
 * aborts and {@link Lock.error} says why.
 *
 * `await using lock = await client.acquire('a|b')` unlocks it at the end of
 * the block.
 */
export class Lock extends EventEmitter {
  /** @internal */ readonly s: Session;
  /** @internal */ readonly client: LockOwner;
  /** @internal */ readonly verb: string;
  /** @internal */ readonly args: string[];
  /** @internal */ readonly timeout: number;
  /** @internal */ state: LockState = 'waiting';
  /** @internal */ call?: Call;
  /** @internal */ sent = 0;
  /** @internal */ base = 0;
  /** @internal */ waitEnd = 0;
  /** @internal The read (Session.reads) that carried the request's result. */
  answeredIn = 0;
  /** @internal held: unlock()'s unlock is in flight. */ unlocking = false;
  /** @internal lost because its deadline passed (see Session.rearm), not by word from the server. */
  lapsed = false;
  /**
   * @internal waiting, granted, but the grant arrived with less than
   * minUsable of its lease to believe: an extend sent after its arrival
   * (see Session.confirm) makes it usable before it is handed over.
   */
  confirming = false;
  /** @internal confirming: extends sent after the first (see MAX_CONFIRMS). */
  confirms = 0;
  /** @internal */ ttlMs: number;
  /** @internal */ _id = '';
  /** @internal */ _token = 0;
  /** @internal */ _expiresAt = 0;
  /** @internal */ _error?: MlockError;
  /** @internal */ _lost?: Promise<MlockError>;
  /** @internal */ _lostResolve?: (e: MlockError) => void;
  /** @internal */ _ac?: AbortController;
  /**
   * @internal Renewals to a shorter lease whose outcome is not known yet (in
   * flight, or their answers lost): each bounds the deadline until a renewal
   * sent at or after it is answered (see Session.shorten).
   */
  shorts: Shortening[] = [];
  /** The owner given to the request, if any. */
  readonly owner?: string;

  /** @internal */
  constructor(s: Session, client: LockOwner, verb: string, args: string[], ttl: number, timeout: number, owner?: string) {
    super();
    this.s = s;
    this.client = client;
    this.verb = verb;
    this.args = args;
    this.ttlMs = ttl;
    this.timeout = timeout;
    if (owner !== undefined) this.owner = owner;
  }

  /** The lock id: 32 hex digits, a secret that lets its holder extend and unlock it. */
  get id(): string {
    return this._id;
  }
  /** The resources as sent, prefix included, joined with `|`. */
  get resources(): string {
    return this.args[0];
  }
  /** The fencing token of the grant: greater than every token given before by the same server or cluster. Guard writes with it. */
  get token(): number {
    return this._token;
  }
  /** The end of the lease as the server reported it (grant or last extend), Unix ms on the server's clock. */
  get expiresAt(): number {
    return this._expiresAt;
  }
  /** The lease of the last grant, extend or renewal, ms. */
  get ttl(): number {
    return this.ttlMs;
  }
  /**
   * Whether the lock is held (granted, not unlocked, not lost). Past its
   * deadline it is lost, even if the timer that loses it could not run yet
   * (the event loop was busy): asking loses it then.
   */
  get held(): boolean {
    this.s.overdue(this);
    return this.state === 'held';
  }
  /** Why the lock was lost; undefined while held or after a normal unlock. */
  get error(): MlockError | undefined {
    this.s.overdue(this);
    return this._error;
  }
  /**
   * Until when (Unix ms, this process's clock) the client believes the lock
   * held; 0 if it is not held. It moves later as the lock is extended and the
   * server answers.
   */
  get deadline(): number {
    this.s.overdue(this);
    if (this.state !== 'held') return 0;
    return Date.now() + (this.s.deadline(this) - mono());
  }
  /** Resolves (never rejects) with the loss when the held lock is lost; never if it is unlocked normally. */
  get lost(): Promise<MlockError> {
    this.s.overdue(this);
    if (!this._lost) {
      this._lost = this._error
        ? Promise.resolve(this._error)
        : new Promise<MlockError>((r) => {
            this._lostResolve = r;
          });
    }
    return this._lost;
  }
  /** Aborted, with the loss as its reason, when the held lock is lost. */
  get signal(): AbortSignal {
    this.s.overdue(this);
    if (!this._ac) {
      this._ac = new AbortController();
      if (this._error) this._ac.abort(this._error);
    }
    return this._ac.signal;
  }

  /**
   * Sets the lease to now + ttl (default: the lock's ttl) and returns the new
   * expiry (Unix ms, server clock). If the server no longer has the lock the
   * lock is lost and this throws an MlockError of type `lost`. A connection
   * error is retried once after a reconnect.
   */
  extend(ttl?: number, opts: { signal?: AbortSignal; deadline?: number } = {}): Promise<number> {
    return this.s.extend(this, ttl, opts.signal, opts.deadline);
  }

  /**
   * Releases the lock (twice is not an error). If the server no longer had it
   * (it expired) this throws an MlockError of type `lost`.
   */
  unlock(opts: { signal?: AbortSignal; deadline?: number } = {}): Promise<void> {
    return this.s.unlock(this, opts.signal, opts.deadline);
  }

  /** Unlocks; a lock already lost is not an error here (its loss was signalled). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.unlock();
    } catch (e) {
      if (!(e instanceof MlockError && e.type === 'lost')) throw e;
    }
  }

  /**
   * @internal Makes a waiting lock held. Its lease counts from the later of
   * its request's send time and resultAck: a request that waited was granted
   * after every result read before the grant. A grant that arrives with less
   * than minUsable of its ttl left to believe (a pause, a slow answer, a
   * resumed session, a failover) is confirmed first by an extend sent now
   * (see Session.confirm), so that every holder gets a lock it can use.
   */
  granted(token: number, expiresAt: number): void {
    if (this.state === 'held') {
      // Announced again after a reconnect: the lease does not move.
      this._token = token;
      this._expiresAt = expiresAt;
      return;
    }
    if (this.state !== 'waiting') return;
    const s = this.s;
    this._token = token;
    this._expiresAt = expiresAt;
    if (this.confirming) return; // announced again while its confirmation is asked
    this.base = Math.max(this.sent, s.resultAck);
    const now = mono();
    if (s.stale(this, now)) {
      this.confirming = true;
      s.confirm(this, now);
      return;
    }
    this.hold();
  }

  /** @internal Makes a waiting lock, whose base is set, held and answers its caller. */
  hold(): void {
    const s = this.s;
    this.state = 'held';
    s.heldLocked(this);
    const cl = this.call;
    this.call = undefined;
    cl?.resolve?.({ payload: this._id, sent: cl.sent, node: s.node, lock: this });
  }

  /** @internal Moves the lease of a held lock after an extend or renewal sent at sent. */
  renewed(sent: number, ttl: number, expiresAt: number): void {
    if (this.state !== 'held') return;
    this.base = Math.max(this.base, sent);
    this.ttlMs = ttl;
    // The server's lease is this renewal's, or a later one's.
    if (this.shorts.length) this.shorts = this.shorts.filter((sh) => sh.sent > sent);
    if (expiresAt) this._expiresAt = expiresAt;
    this.s.heldLocked(this);
  }

  /** @internal Ends a waiting lock with waitErr or a held one with lostErr. */
  fail(waitErr: MlockError | undefined, lostErr: MlockError | undefined): void {
    if (this.state === 'waiting' && waitErr) {
      this.state = 'failed';
      const cl = this.call;
      this.call = undefined;
      cl?.reject?.(waitErr);
    } else if (this.state === 'held' && lostErr) {
      this.state = 'lost';
      this._error = lostErr;
      this._lostResolve?.(lostErr);
      this._ac?.abort(lostErr);
      this.emit('lost', lostErr);
      this.client.emit('lost', lostErr, this);
    }
  }
}

/** The errors of a lost lock. */
export const lostErrors = {
  expired: () => new MlockError('lock expired, or released by its owner', 'lost', { reason: 'expired' }),
  released: () => new MlockError('lock released by its owner', 'lost', { reason: 'released' }),
  evicted: () => new MlockError('lock evicted by an administrator', 'lost', { reason: 'evicted' }),
  session: () => new MlockError('session lost: the server no longer holds its locks', 'lost', { reason: 'session lost' }),
  shutdown: () => new MlockError('server shutting down', 'lost', { reason: 'shutdown' }),
  deadline: (bySession: boolean) =>
    bySession
      ? new MlockError('no answer from the server within its session grace', 'lost', { reason: 'session lost' })
      : new MlockError('lease ran out without word from the server', 'lost', { reason: 'expired' }),
  destroyed: () => new MlockError('client destroyed', 'lost', { reason: 'destroyed' }),
  mayBeReleased: () => new MlockError('a release by its owner may have freed it (its answer was lost)', 'lost', { reason: 'released' }),
};

const destroyedError = () => new MlockError('client destroyed', 'connection', { reason: 'destroyed' });

interface UpWaiter {
  client?: LockOwner;
  resolve: () => void;
  reject: (e: MlockError) => void;
  timer: NodeJS.Timeout;
}

/** Receives the session's connection events (the clients). */
export interface SessionListener {
  emit(event: string, ...args: unknown[]): boolean;
}

/** One session: see the top of this file. */
export class Session {
  readonly key: string;
  readonly nodes: Resolved['addrs'];
  readonly sid: string;
  readonly opts: Resolved;
  refs = 0;
  closed = false;
  readonly listeners = new Set<SessionListener>();

  private sock?: net.Socket;
  // The connection being dialled, until its handshake is answered (then it
  // is sock) or it closes: held open with the session (see ref).
  private dialing?: net.Socket;
  node = '';
  private connected = false;
  private out: string[] = [];
  private flushQueued = false;
  // Reads so far, and whether the current turn hands a lock over: a read
  // carried the grant of a request that waited in a queue (see queue).
  private reads = 0;
  private handoff = false;
  private seq = 0;
  private readonly calls = new Map<number, Call>();
  readonly locks = new Map<string, Lock>();
  private everUp = false;
  private readonly upWaiters = new Set<UpWaiter>();
  private refused?: MlockError;
  private readonly nodeErrs: (Error | undefined)[];
  private next = 0;
  private tried = 0;
  private roundRefusal?: MlockError;
  private backoff = 0;
  private upAt = 0; // mono() of the last handshake
  private reconnectTimer?: NodeJS.Timeout;
  private refed = true;
  // Lock requests whose connection dropped before their result: the server
  // may or may not have queued them, so they are asked again on the next
  // connection (see reaskCalls), unless a whole round of dials fails first
  // (see attemptFailed).
  private reasks: Call[] = [];
  // Grants being given back (see forget): id -> the request id of its
  // unlock, until the unlock is answered or the connection drops. A lock
  // request answered with such an id (an owner's request that renewed it by
  // re-entry before the unlock) holds nothing once the unlock is applied: it
  // is asked again.
  private readonly giving = new Map<string, number>();
  // The move to the cluster's leader (see dial): the follower whose
  // connection was left for the leader it named (-1: none), and false once
  // the leader named did not answer.
  private moveFrom = -1;
  private mayMove = true;

  // The safety rule (monotonic ms). lastAck: the latest send time of a
  // request answered with success (not status), handshakes included: the
  // session's end counts from it. resultAck: the same, handshakes excepted:
  // grants count from it.
  lastAck = 0;
  resultAck = 0;
  private grace = 0;
  private graceKnown = false;
  private clock?: NodeJS.Timeout;
  private clockAt = 0;
  private pingTimer?: NodeJS.Timeout;
  private pingEvery = 0;

  constructor(key: string, opts: Resolved, sid: string | undefined) {
    this.key = key;
    this.opts = opts;
    this.nodes = opts.addrs;
    this.sid = sid ?? randomBytes(16).toString('hex');
    this.nodeErrs = new Array(this.nodes.length).fill(undefined);
    this.dial();
  }

  private log(msg: string): void {
    if (this.opts.debug) console.debug(`mlock ${this.nodes.map((n) => n.addr).join(',')}: ${msg}`);
  }

  private notify(event: string, ...args: unknown[]): void {
    for (const l of this.listeners) l.emit(event, ...args);
  }

  // ---- transport ----

  private dial(): void {
    this.reconnectTimer = undefined;
    if (this.closed) return;
    const i = this.next;
    this.next = (i + 1) % this.nodes.length;
    const n = this.nodes[i];
    let sent = 0;
    let refusal: MlockError | undefined;
    let lastErr: Error | undefined;
    let hello = false;
    let bye = false;
    let moved = false;
    // Only a session's first connection moves, and only from a node that
    // created it ("new"): nothing of the session is held, waited for or
    // kept offline yet, so leaving that connection unread loses nothing
    // (see leaderNode).
    const ask = !this.everUp && this.mayMove && this.moveFrom < 0 && this.nodes.length > 1 && !this.opts.stayOnNode;
    const onConnect = () => {
      sent = mono();
      const auth = this.opts.name !== undefined ? ` auth=${this.opts.name}:${this.opts.token}` : '';
      // With want=leader a cluster follower names the leader.
      sock.write(encode(`connect ${this.sid} 1.0${auth}${ask ? ' want=leader' : ''}`));
    };
    // A plain connection reads into the shared read buffer (no buffer, and
    // no stream event, per read); TLS through its stream.
    const sock: net.Socket = this.opts.tls
      ? tls.connect({ servername: net.isIP(n.host) ? undefined : n.host, minVersion: 'TLSv1.2', ...this.opts.tls, host: n.host, port: n.port }, onConnect)
      : net.connect({ host: n.host, port: n.port, onread: { buffer: readBuffer, callback: onRead } }, onConnect);
    sock.setNoDelay(true);
    sock.setKeepAlive(true, 15000);
    if (!this.refed) sock.unref();
    this.dialing = sock;
    // A timer runs before the reads of its loop turn: after a turn that kept
    // the process busy, an answer already received is read first (setImmediate).
    const dialTimer = setTimeout(() => setImmediate(() => hello || sock.destroy(new Error('connection attempt timed out'))), this.opts.dialTimeout);
    dialTimer.unref();
    const dec = new Decoder();
    // The frames of a chunk read; transient: chunk is the shared read buffer.
    const onChunk = (chunk: Buffer, transient: boolean): void => {
      let frames: string[];
      this.reads++;
      try {
        frames = dec.push(chunk, transient);
      } catch (e) {
        sock.destroy(e as Error);
        return;
      }
      for (const f of frames) {
        if (!hello) {
          hello = true;
          clearTimeout(dialTimer);
          const w = f.split(' ');
          if (w[0] === 'connected') {
            const j = ask && w[2] === 'new' ? this.leaderNode(w, i) : -1;
            if (j >= 0) {
              this.log(`moving to the cluster's leader ${this.nodes[j].addr} (named by ${n.addr})`);
              moved = true;
              this.next = j;
              this.moveFrom = i;
              sock.destroy();
              return;
            }
            this.attached(sock, i, w, sent);
            continue;
          }
          if (w[0] === 'error') {
            const text = w.slice(1).join(' ');
            // A shutdown, an auth timeout (the server did not get the
            // connect in time: held up on its way) or an eviction (the
            // server's pool of connections before their connect was full)
            // is no refusal: the next attempt may well succeed.
            if (text !== 'server shutting down!' && text !== 'auth timeout!' && text !== 'too many unauthenticated connections!') refusal = new MlockError(text, 'connection', { node: n.addr, reason: text });
            lastErr = new Error(text);
          } else {
            lastErr = new Error(`unexpected answer to connect: ${JSON.stringify(f.slice(0, 80))}`);
          }
          sock.destroy();
          return;
        }
        if (this.sock !== sock) return;
        if (this.message(f)) {
          bye = true;
          // Every held lock is marked lost: confirm it to the server.
          this.queue(`bye ${++this.seq}`);
          this.flush();
          sock.end();
          return;
        }
      }
    };
    if (this.opts.tls) sock.on('data', (chunk: Buffer) => onChunk(chunk, false));
    function onRead(len: number): boolean {
      onChunk(readBuffer.subarray(0, len), true);
      return true;
    }
    sock.on('error', (e: Error) => {
      lastErr = e;
    });
    sock.on('close', () => {
      clearTimeout(dialTimer);
      if (this.dialing === sock) this.dialing = undefined;
      if (this.sock === sock) {
        this.detached(i, lastErr, bye);
      } else if (moved) {
        if (!this.closed) this.dial(); // the leader
      } else if (this.moveFrom >= 0 && !this.closed) {
        // The leader did not answer: back to the follower, to stay.
        const err = refusal ?? lastErr ?? new Error('connection closed');
        this.nodeErrs[i] = err;
        this.log(`the cluster's leader ${n.addr} did not answer (${err.message}); staying on a follower`);
        this.next = this.moveFrom;
        this.moveFrom = -1;
        this.mayMove = false;
        this.dial();
      } else {
        this.attemptFailed(i, refusal ?? lastErr ?? new Error('connection closed'), refusal);
      }
    });
  }

  /**
   * The index of the node a follower named as the cluster's leader in its
   * answer w (`connected 1.0 new <grace> leader=<host:port>`, asked with
   * want=leader), or -1: none named, node i itself, or not one of the
   * session's nodes (compared as written, letter case aside). A resumed
   * session never moves: the follower's answer carries its offline pushes
   * and held locks, which must be read.
   */
  private leaderNode(w: string[], i: number): number {
    const word = w.slice(4).find((x) => x.startsWith('leader='));
    if (!word) return -1;
    const leader = word.slice('leader='.length).toLowerCase();
    return this.nodes.findIndex((n, j) => j !== i && n.addr.toLowerCase() === leader);
  }

  /** The handshake succeeded: `connected 1.0 new|resumed <graceMs>`. */
  private attached(sock: net.Socket, i: number, w: string[], sent: number): void {
    if (this.closed) {
      sock.destroy();
      return;
    }
    const resumed = w[2] === 'resumed';
    const grace = w[3] !== undefined && /^\d+$/.test(w[3]) ? Number(w[3]) : -1;
    this.graceKnown = grace >= 0;
    this.grace = Math.max(grace, 0);
    // The handshake is an answer on the session: the session's end counts
    // from its send time (grants do not: see Lock.granted).
    this.lastAck = !this.everUp || !resumed ? sent : Math.max(this.lastAck, sent);
    this.sock = sock;
    this.dialing = undefined;
    this.connected = true;
    this.node = this.nodes[i].addr;
    this.moveFrom = -1;
    this.refused = undefined;
    this.tried = 0;
    this.roundRefusal = undefined;
    this.upAt = mono();
    this.nodeErrs.fill(undefined);
    if (this.everUp && !resumed) this.newSession(mono());
    else if (this.everUp) this.probeWaits(mono());
    this.reaskCalls(mono());
    const wasUp = this.everUp;
    this.everUp = true;
    for (const w of this.upWaiters) {
      clearTimeout(w.timer);
      w.resolve();
    }
    this.upWaiters.clear();
    this.rearm();
    this.pingEvery = 0;
    this.schedulePing();
    this.flush();
    this.log(`connected to ${this.node} (${resumed ? 'resumed' : 'new'} session, grace ${grace} ms)`);
    this.notify(wasUp ? 'reconnect' : 'connect', this.node, resumed);
    this.idleCheck();
  }

  /** The connection to node i ended. */
  private detached(i: number, err: Error | undefined, bye: boolean): void {
    const addr = this.nodes[i].addr;
    this.sock = undefined;
    this.connected = false;
    this.node = '';
    this.out = [];
    clearTimeout(this.pingTimer);
    const e = this.closed
      ? destroyedError()
      : new MlockError('connection lost', 'connection', { node: addr, cause: err });
    for (const [seq, cl] of this.calls) {
      this.calls.delete(seq);
      if (cl.lock && !cl.abandoned && !this.closed && (cl.drops ?? 0) < MAX_DROPS - 1) {
        // Its outcome is unknown: asked again on the next connection.
        cl.drops = (cl.drops ?? 0) + 1;
        this.reasks.push(cl);
        continue;
      }
      if (cl.lock) cl.lock.state = 'failed';
      cl.reject?.(e);
    }
    this.giving.clear();
    // A timeout push can be lost with the connection: the waits' backstops
    // join the session's timer.
    this.rearm();
    if (this.closed) return;
    this.idleCheck();
    this.log(`connection to ${addr} lost${err ? `: ${err.message}` : ''}; reconnecting`);
    this.notify('disconnect', addr, err);
    const stable = mono() - this.upAt >= STABLE_CONN;
    if (stable) this.backoff = 0;
    if (bye) {
      this.attemptFailed(i, new Error('server shutting down'), undefined);
      return;
    }
    if (stable) {
      // Another node (or the same one again) at once.
      setImmediate(() => this.dial());
      return;
    }
    // Dropped soon after the handshake (a server that closes every
    // connection at once): reconnecting at once would hammer it; the backoff
    // grows as after a failed round.
    this.backoff = Math.min(Math.max(2 * this.backoff, 50), this.opts.maxBackoff);
    const wait = this.backoff * (0.5 + Math.random() / 2);
    this.reconnectTimer = setTimeout(() => this.dial(), wait);
    if (!this.refed) this.reconnectTimer.unref();
  }

  /** A connection attempt to node i failed (refusal: the server refused it). */
  private attemptFailed(i: number, err: Error, refusal: MlockError | undefined): void {
    if (this.closed) return;
    this.nodeErrs[i] = err;
    this.tried++;
    if (refusal) this.roundRefusal = refusal;
    if (this.tried < this.nodes.length) {
      this.log(`connecting to ${this.nodes[i].addr} failed: ${err.message}; trying the next node`);
      setImmediate(() => this.dial());
      return;
    }
    this.backoff = Math.min(Math.max(2 * this.backoff, 50), this.opts.maxBackoff);
    const r = this.roundRefusal;
    this.tried = 0;
    this.roundRefusal = undefined;
    // No node took the session at once: the try-locks waiting to be asked
    // again fail rather than wait for the server to come back (a try asks
    // not to wait), and every one if the server refused the connection. A
    // lock request that waits keeps waiting, as one the server queued does
    // across a reconnect: asked again once a node takes the session, it
    // ends at its wait's timeout (see the reasks' backstop), its signal, or
    // after the connections it was in flight on.
    const reasks = this.reasks;
    this.reasks = [];
    for (const cl of reasks) {
      if (!r && cl.lock!.verb !== 'trylock') {
        this.reasks.push(cl);
        continue;
      }
      cl.lock!.state = 'failed';
      cl.lock!.call = undefined;
      cl.reject?.(r ?? new MlockError('connection lost', 'connection', { node: this.nodes[i].addr, cause: err }));
    }
    if (r) {
      // Refused: retrying soon will not help, but the server's configuration
      // may change. Waiting requests will not be granted meanwhile.
      this.backoff = this.opts.maxBackoff;
      this.refused = r;
      for (const w of this.upWaiters) {
        clearTimeout(w.timer);
        w.reject(r);
      }
      this.upWaiters.clear();
      for (const [id, l] of this.locks) {
        if (l.state === 'waiting') {
          this.locks.delete(id);
          l.fail(r, undefined);
        }
      }
    } else if (!this.everUp && this.nodeErrs.every((e) => (e as NodeJS.ErrnoException | undefined)?.code === 'ECONNREFUSED')) {
      // Nothing listens on any node: waiting the whole dial timeout would only hide it.
      const u = this.unreachable();
      for (const w of this.upWaiters) {
        clearTimeout(w.timer);
        w.reject(u);
      }
      this.upWaiters.clear();
    }
    this.idleCheck();
    const wait = this.backoff * (0.5 + Math.random() / 2);
    this.log(`connecting to ${this.nodes[i].addr} failed: ${err.message}; retrying in ${Math.round(wait)} ms`);
    this.reconnectTimer = setTimeout(() => this.dial(), wait);
    if (!this.refed) this.reconnectTimer.unref();
  }

  private unreachable(): MlockError {
    if (this.nodes.length === 1) {
      const err = this.nodeErrs[0];
      return new MlockError(`server unreachable: ${this.nodes[0].addr}${err ? `: ${err.message}` : ''}`, 'connection', {
        node: this.nodes[0].addr,
        cause: err,
      });
    }
    const parts = this.nodes.map((n, i) => `${n.addr}: ${this.nodeErrs[i]?.message ?? 'no attempt finished yet'}`);
    return new MlockError(`no server reachable: ${parts.join('; ')}`, 'connection');
  }

  /** Waits until the connection is up, at most dialTimeout (and until deadline, Unix ms). */
  private waitUp(signal?: AbortSignal, client?: LockOwner, deadline?: number, lockEnd?: number): Promise<void> {
    if (this.closed) return Promise.reject(destroyedError());
    if (this.connected) return Promise.resolve();
    if (this.refused) return Promise.reject(this.refused);
    const now = Date.now();
    const left = deadline === undefined ? Infinity : deadline - now;
    const lockLeft = lockEnd === undefined ? Infinity : lockEnd - now;
    // The caller's own deadline wins a tie (it was set first, and names itself).
    const byLock = lockLeft < this.opts.dialTimeout && lockLeft < left;
    const byDeadline = !byLock && left < this.opts.dialTimeout;
    const wait = byLock ? Math.max(lockLeft, 0) : byDeadline ? Math.max(left, 0) : this.opts.dialTimeout;
    return new Promise<void>((resolve, reject) => {
      const w: UpWaiter = {
        client,
        resolve: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        },
        reject: (e) => {
          signal?.removeEventListener('abort', onAbort);
          reject(e);
        },
        timer: setTimeout(() => {
          this.upWaiters.delete(w);
          w.reject(byLock ? lockWaitError(this.unreachable()) : byDeadline ? deadlineError() : this.unreachable());
          this.idleCheck();
        }, wait),
      };
      const onAbort = () => {
        clearTimeout(w.timer);
        this.upWaiters.delete(w);
        reject(canceled(signal!));
        this.idleCheck();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.upWaiters.add(w);
      this.ref(true);
    });
  }

  /**
   * Keeps the process alive while anything is in flight, held or waited for;
   * lets it exit otherwise (a client that is only idle does not hold the
   * process open).
   */
  private ref(on: boolean): void {
    if (on === this.refed) return;
    this.refed = on;
    if (on) {
      this.sock?.ref();
      this.dialing?.ref();
      this.reconnectTimer?.ref();
    } else {
      this.sock?.unref();
      this.dialing?.unref();
      this.reconnectTimer?.unref();
    }
  }

  private idleCheck(): void {
    if (this.calls.size === 0 && this.locks.size === 0 && this.upWaiters.size === 0 && this.reasks.length === 0) this.ref(false);
  }

  private queue(text: string): void {
    if (!this.flushQueued) {
      this.flushQueued = true;
      // The first command of a turn goes out at once when the socket has
      // nothing waiting to be written: the server starts on it while the rest
      // of the turn runs. What the callers woken in the same turn queue after
      // it goes in one write at the end of the turn (the same macrotask: a
      // lone command is never delayed). A turn that hands a lock over goes
      // whole in one write: the release that the next waiter's grant depends
      // on need not be its first command, and one write gets it to the
      // server soonest.
      process.nextTick(this.endTurn);
      const sock = this.sock;
      if (!this.handoff && sock && this.connected && this.out.length === 0 && sock.writableLength === 0) {
        sock.write(encode(text));
        return;
      }
    }
    this.out.push(text);
  }

  private readonly endTurn = (): void => this.flush();

  private flush(): void {
    this.flushQueued = false;
    this.handoff = false;
    if (!this.sock || !this.connected || this.out.length === 0) return;
    const b = encodeAll(this.out);
    this.out = [];
    this.sock.write(b);
  }

  // ---- calls ----

  /**
   * Sends one command and resolves with its answer: its result, or for lock
   * and trylock (lock set) the grant.
   */
  call(verb: string, args: string[], signal?: AbortSignal, lock?: Lock, ctx?: CallCtx): Promise<Reply> {
    if (signal?.aborted) return Promise.reject(canceled(signal));
    const dl = ctx?.deadline;
    if (dl !== undefined && dl <= Date.now()) return Promise.reject(deadlineError());
    if (this.connected && !this.closed) return this.send(verb, args, signal, lock, ctx);
    // A lock waits for the connection at most its own wait timeout, and then
    // asks the server for what is left of it.
    let lockEnd = ctx?.lockEnd;
    if (lockEnd === undefined && lock !== undefined && verb === 'lock' && lock.timeout > 0) lockEnd = Date.now() + lock.timeout;
    return this.waitUp(signal, ctx?.client ?? lock?.client, dl, lockEnd).then(() => {
      if (lockEnd === undefined) return this.call(verb, args, signal, lock, ctx);
      args[2] = String(Math.max(1, Math.floor(lockEnd - Date.now())));
      return this.call(verb, args, signal, lock, { ...ctx, lockEnd });
    });
  }

  private send(verb: string, args: string[], signal: AbortSignal | undefined, lock: Lock | undefined, ctx: CallCtx | undefined): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => {
      const now = mono();
      const seq = ++this.seq;
      const cl: Call = { seq, verb, sent: now, lock, client: ctx?.client ?? lock?.client };
      const dl = ctx?.deadline;
      if (ctx) ctx.sent = true;
      if (signal || dl !== undefined) {
        // Given up when the signal aborts or at the deadline, whichever
        // comes first (a timer costs far less than an AbortSignal.timeout).
        let timer: NodeJS.Timeout | undefined;
        const onAbort = () => {
          if (!this.abandon(cl)) return;
          clearTimeout(timer);
          reject(canceled(signal!));
        };
        signal?.addEventListener('abort', onAbort, { once: true });
        if (dl !== undefined) {
          timer = setTimeout(() => {
            if (!this.abandon(cl)) return;
            signal?.removeEventListener('abort', onAbort);
            reject(deadlineError());
          }, Math.max(dl - Date.now(), 0));
          timer.unref();
        }
        cl.resolve = (r) => {
          signal?.removeEventListener('abort', onAbort);
          clearTimeout(timer);
          resolve(r);
        };
        cl.reject = (e) => {
          signal?.removeEventListener('abort', onAbort);
          clearTimeout(timer);
          reject(e);
        };
      } else {
        cl.resolve = resolve;
        cl.reject = reject;
      }
      this.calls.set(seq, cl);
      if (lock) {
        lock.state = 'waiting';
        lock.sent = now;
        lock.call = cl;
        // The server's timeout push can be lost with a connection.
        if (lock.timeout > 0) lock.waitEnd = now + lock.timeout + this.opts.dialTimeout;
      }
      this.ref(true);
      this.queue(args.length ? `${verb} ${seq} ${args.join(' ')}` : `${verb} ${seq}`);
    });
  }

  /** Gives up a call whose caller stopped waiting; false if it is answered already. */
  private abandon(cl: Call): boolean {
    if (this.calls.get(cl.seq) === cl) {
      if (cl.lock) {
        cl.abandoned = true; // the result gives the lock back
        cl.lock.state = 'failed';
      } else this.calls.delete(cl.seq);
      return true;
    }
    const i = this.reasks.indexOf(cl);
    if (i >= 0) {
      // Waiting to be asked again: never asked on this connection.
      this.reasks.splice(i, 1);
      cl.lock!.state = 'failed';
      cl.lock!.call = undefined;
      this.idleCheck();
      return true;
    }
    const l = cl.lock;
    if (l && l.call === cl) {
      l.call = undefined;
      this.drop(l);
      return true;
    }
    return false;
  }

  /** Sends a command whose answer nobody waits for; returns its call (undefined: not connected). */
  private fire(verb: string, args: string[]): Call | undefined {
    if (!this.connected) return undefined;
    const seq = ++this.seq;
    const cl: Call = { seq, verb, sent: mono() };
    this.calls.set(seq, cl);
    this.queue(`${verb} ${seq} ${args.join(' ')}`);
    return cl;
  }

  /**
   * Gives a lock id back to the server (best effort), and remembers it as
   * being given back until the unlock is answered or the connection drops
   * (see result).
   */
  private forget(id: string): void {
    const cl = this.fire('unlock', [id]);
    if (!cl) return;
    cl.giving = id;
    this.giving.set(id, cl.seq);
  }

  /** call, retried once after a connection error: for idempotent commands. */
  async retry(verb: string, args: string[], signal?: AbortSignal, ctx?: CallCtx): Promise<Reply> {
    try {
      return await this.call(verb, args, signal, undefined, ctx);
    } catch (e) {
      if (e instanceof MlockError && e.type === 'connection' && e.reason !== 'destroyed' && !signal?.aborted && !this.refused) {
        return this.call(verb, args, signal, undefined, ctx);
      }
      throw e;
    }
  }

  // ---- messages ----

  /** Handles one frame; true if the server said it is shutting down. */
  private message(text: string): boolean {
    const sp = text.indexOf(' ');
    let cmd = sp < 0 ? text : text.slice(0, sp);
    // The server writes its verbs in lower case; others are folded.
    if (cmd !== 'result' && cmd !== 'locked') cmd = cmd.toLowerCase();
    const rest = sp < 0 ? '' : text.slice(sp + 1);
    switch (cmd) {
      case 'result': {
        const a = rest.indexOf(' ');
        const b = rest.indexOf(' ', a + 1);
        const req = rest.slice(0, a);
        const ok = (b < 0 ? rest.slice(a + 1) : rest.slice(a + 1, b)) === 'success';
        this.result(Number(req), ok, b < 0 ? '' : rest.slice(b + 1));
        break;
      }
      case 'locked': {
        // locked <id> <expiresAt> [<token>] (words after the token are ignored)
        const a = rest.indexOf(' ');
        const b = a < 0 ? -1 : rest.indexOf(' ', a + 1);
        const c = b < 0 ? -1 : rest.indexOf(' ', b + 1);
        const id = a < 0 ? rest : rest.slice(0, a);
        const exp = a < 0 ? undefined : b < 0 ? rest.slice(a + 1) : rest.slice(a + 1, b);
        const token = b < 0 ? undefined : c < 0 ? rest.slice(b + 1) : rest.slice(b + 1, c);
        const l = this.locks.get(id);
        if (!l) {
          // A grant nobody waits for (its request's answer was lost with a
          // connection, or its caller gave up): give it back at once.
          this.forget(id);
          break;
        }
        // A grant that waited (its result came in an earlier read): a hand-off.
        if (l.state === 'waiting' && l.answeredIn !== this.reads) this.handoff = true;
        l.granted(token === undefined ? 0 : Number(token), Number(exp));
        break;
      }
      case 'timeout': {
        const l = this.locks.get(rest);
        if (l && l.state === 'waiting') {
          this.locks.delete(rest);
          l.fail(new MlockError('Lock timeout', 'timeout'), undefined);
        }
        break;
      }
      case 'expired': {
        const [id, how] = rest.split(' ');
        const l = this.locks.get(id);
        if (!l) break;
        if (l.state === 'waiting') {
          // Its grant was lost with a connection and it is over already: it
          // held nothing here. Ask again.
          this.locks.delete(id);
          this.reask(l, mono());
          break;
        }
        // The word after the id names the cause; an unknown one is an expiry.
        let e: MlockError;
        switch (how) {
          case 'released':
            e = lostErrors.released();
            break;
          case 'evicted':
            e = lostErrors.evicted();
            break;
          case 'shutdown':
            e = lostErrors.shutdown();
            break;
          default:
            e = lostErrors.expired();
        }
        this.lose(l, e);
        break;
      }
      case 'error':
        if (rest === 'server shutting down!') {
          this.shuttingDown();
          return true;
        }
        // The server closes the connection after an error: the client
        // reconnects (the original gave up for good).
        this.log(`server error: ${rest}`);
        break;
      default:
        this.log(`unknown message from the server: ${text.slice(0, 80)}`);
    }
    if (this.closed) this.endIfDone();
    this.idleCheck();
    return false;
  }

  private result(seq: number, ok: boolean, payload: string): void {
    const cl = this.calls.get(seq);
    if (!cl) return;
    this.calls.delete(seq);
    if (cl.giving !== undefined && this.giving.get(cl.giving) === seq) this.giving.delete(cl.giving);
    if (ok && cl.verb !== 'status' && cl.verb !== 'locks') {
      // Status and locks are answered from the state of the node asked (in a
      // cluster, one that may lag), and a refusal may be answered before the
      // request reaches the lock table: neither bounds when the session was
      // alive or when a later grant was made.
      if (cl.sent > this.lastAck) this.lastAck = cl.sent;
      if (cl.sent > this.resultAck) this.resultAck = cl.sent;
    }
    if (cl.probe) {
      this.probed(cl.probe, ok, payload, cl.sent);
      return;
    }
    if (
      !ok &&
      cl.verb === 'trylock' &&
      cl.drops &&
      !cl.busyRetried &&
      !cl.abandoned &&
      this.giving.size > 0 &&
      (payload === 'resource is locked!' || payload.startsWith('resource is locked! '))
    ) {
      // A try-lock asked again after a connection loss, refused by its own
      // first grant, which this session is giving back: once more.
      cl.busyRetried = true;
      this.resend(cl, mono());
      return;
    }
    if (!ok) {
      if (cl.lock) cl.lock.state = 'failed';
      cl.reject?.(failure(payload));
      return;
    }
    if (cl.verb === 'lock' || cl.verb === 'trylock') {
      const l = cl.lock!;
      if (cl.abandoned) {
        // Nobody waits for it: give it back, unless the answer names a lock
        // another handle of the session holds or waits for (an owner's
        // re-entry): that lock stays theirs, its lease renewed if held.
        const old = this.locks.get(payload);
        if (!old) this.forget(payload);
        else if (old.state === 'held') old.renewed(cl.sent, l.ttlMs, 0);
        this.endIfDone();
        return;
      }
      if (this.giving.has(payload)) {
        // An owner's request that renewed, by re-entry, a grant this session
        // is giving back: the unlock that follows frees it.
        this.resend(cl, mono());
        return;
      }
      const old = this.locks.get(payload);
      if (old && old !== l && (old.unlocking || old.state === 'waiting')) {
        // An owner's re-entry onto a lock being unlocked here (the unlock
        // that follows frees it), or onto a waiting request whose grant has
        // not arrived yet (it comes before the answer of the request asked
        // again, which then renews the held lock).
        this.resend(cl, mono());
        return;
      }
      if (old && old.state === 'held') {
        // An owner's renewal of a lock it holds: the same lock.
        old.renewed(cl.sent, l.ttlMs, 0);
        l.state = 'released';
        cl.resolve?.({ payload, sent: cl.sent, node: this.node, lock: old });
        return;
      }
      // Granted or queued: the locked push (or the failure) that follows
      // answers the call.
      l._id = payload;
      l.answeredIn = this.reads;
      this.locks.set(payload, l);
      l.call = cl;
      this.keepAlive(this.keepSpan(l));
      return;
    }
    cl.resolve?.({ payload, sent: cl.sent, node: this.node });
  }

  // ---- locks ----

  /** When l (held) stops being believed held, monotonic ms. */
  deadline(l: Lock): number {
    let d = l.base + l.ttlMs - margin(l.ttlMs);
    for (const sh of l.shorts) d = Math.min(d, sh.at);
    if (this.graceKnown) d = Math.min(d, this.lastAck + this.grace - margin(this.grace));
    return d;
  }

  /** deadline(l), and whether the session's end (not the lease) sets it. */
  private deadlineOf(l: Lock): [number, boolean] {
    let d = l.base + l.ttlMs - margin(l.ttlMs);
    for (const sh of l.shorts) d = Math.min(d, sh.at);
    if (this.graceKnown) {
      const e = this.lastAck + this.grace - margin(this.grace);
      if (e < d) return [e, true];
    }
    return [d, false];
  }

  /**
   * Loses l (and every held lock) at once if its deadline passed although
   * the timer that loses it has not run yet: the event loop was busy.
   */
  overdue(l: Lock): void {
    if (l.state === 'held' && !this.closed && this.deadline(l) <= mono()) this.rearm();
  }

  /** A lock became held or its lease moved. */
  heldLocked(l: Lock): void {
    const d = this.deadline(l);
    if (!this.clock || d < this.clockAt) this.arm(d);
    this.keepAlive(this.keepSpan(l));
  }

  /**
   * Notes a request about to be sent (at now or later) that renews held lock
   * l to ttl from when the server handles it: an extend, an owner's re-entry
   * or a renew by owner. If that lease may end before the one l is believed
   * to hold, the deadline is bounded by it at once: the answer may never
   * arrive (the connection drops, the caller gives up) while the server
   * applied it. The bound goes when a renewal sent at or after the request
   * is answered (see Lock.renewed), or when the server refuses the request
   * (see unshorten). Returns the bound, or undefined.
   */
  shorten(l: Lock, now: number, ttl: number): Shortening | undefined {
    if (l.state !== 'held') return undefined;
    const at = now + ttl - margin(ttl);
    if (at >= l.base + l.ttlMs - margin(l.ttlMs)) return undefined; // no shorter than the lease believed
    const sh = { at, sent: now };
    l.shorts.push(sh);
    this.heldLocked(l);
    return sh;
  }

  /** Drops the bounds of requests the server refused (err is its answer: they were not applied). */
  unshorten(bounds: [Lock, Shortening][], err: unknown): void {
    if (unanswered(err)) return;
    for (const [l, sh] of bounds) l.shorts = l.shorts.filter((x) => x !== sh);
  }

  /** shorten for every held handle of owner on exactly the resources res. */
  shortenOwned(owner: string, res: string, now: number, ttl: number): [Lock, Shortening][] {
    const out: [Lock, Shortening][] = [];
    let set: string | undefined; // computed only if owner holds a lock here
    for (const l of this.locks.values()) {
      if (l.owner !== owner || l.state !== 'held') continue;
      set ??= nameSet(res);
      if (nameSet(l.resources) !== set) continue;
      const sh = this.shorten(l, now, ttl);
      if (sh) out.push([l, sh]);
    }
    return out;
  }

  /**
   * Loses the held handles of owner that a release by owner of the resources
   * res (all of owner's, if res is undefined) may have freed, although its
   * answer, and the server's word of the release, never arrived: their
   * holders must not go on believing them held. They are given back, in case
   * the release was not applied.
   */
  mayBeReleased(owner: string, res: string | undefined): void {
    const names = res === undefined ? undefined : new Set(res.split('|'));
    for (const [id, l] of this.locks) {
      if (l.state !== 'held' || l.owner !== owner) continue;
      if (names && !l.resources.split('|').some((x) => names.has(x))) continue;
      this.lose(l, lostErrors.mayBeReleased());
      this.forget(id);
    }
    this.idleCheck();
  }

  /**
   * The span within which the session must be answered for l's sake: the
   * shorter of the grace and its ttl while held, and three quarters of that
   * while waiting. The keep-alive period is a third of it: a waiting session
   * is answered at least every quarter of the shorter of the grace and the
   * smallest ttl it waits for, so a grant (whose lease counts from the last
   * answer read before it) arrives with about three quarters of both to
   * believe.
   */
  private keepSpan(l: Lock): number {
    let span = this.graceKnown ? this.grace : Infinity;
    if (l.state === 'held') span = Math.min(span, l.ttlMs);
    else if (l.state === 'waiting') span = (Math.min(span, l.ttlMs) * 3) / 4;
    return span;
  }

  /**
   * @internal Whether waiting lock l, its base set, would leave less than
   * minUsable of the shorter of its ttl and the grace (the deadline counts
   * both) to believe from now: its grant is then confirmed first.
   */
  stale(l: Lock, now: number): boolean {
    const span = this.graceKnown ? Math.min(l.ttlMs, this.grace) : l.ttlMs;
    return this.deadline(l) - now < minUsable(span);
  }

  private keepAlive(span: number): void {
    const p = Math.max(span / 3, MIN_KEEPALIVE);
    if (p < this.pingEvery) {
      this.pingEvery = p;
      this.schedulePing();
    }
  }

  private pingPeriod(): number {
    let p = this.opts.pingInterval;
    for (const l of this.locks.values()) p = Math.min(p, Math.max(this.keepSpan(l) / 3, MIN_KEEPALIVE));
    return p;
  }

  private schedulePing(): void {
    clearTimeout(this.pingTimer);
    if (!this.connected) return;
    if (this.pingEvery === 0) this.pingEvery = this.pingPeriod();
    const wait = this.lastAck + this.pingEvery - mono();
    this.pingTimer = setTimeout(() => this.pingTick(), Math.max(wait, 0));
    this.pingTimer.unref();
  }

  /** Pings when nothing was answered for a keep-alive period; drops a connection whose server does not answer. */
  private pingTick(): void {
    if (!this.connected) return;
    this.pingEvery = this.pingPeriod();
    const every = this.pingEvery;
    if (this.lastAck + every - mono() > 0) {
      this.schedulePing();
      return;
    }
    const sock = this.sock!;
    const seq = ++this.seq;
    const timer = setTimeout(
      () =>
        // Timers run before the reads of their loop turn: a pong that came
        // while the process was busy is read first (setImmediate), and counts.
        setImmediate(() => {
          if (!this.calls.has(seq)) return;
          this.log('server does not answer pings; reconnecting');
          this.calls.delete(seq);
          sock.destroy(new Error('no answer to ping'));
        }),
      Math.max(every, 1000),
    );
    timer.unref();
    this.calls.set(seq, {
      seq,
      verb: 'ping',
      sent: mono(),
      resolve: () => {
        clearTimeout(timer);
        this.schedulePing();
      },
      reject: () => clearTimeout(timer),
    });
    this.queue(`ping ${seq}`);
  }

  private arm(at: number): void {
    clearTimeout(this.clock);
    this.clockAt = at;
    this.clock = setTimeout(() => this.tick(), Math.max(at - mono(), 0));
    this.clock.unref();
  }

  private tick(): void {
    this.clock = undefined;
    if (!this.closed) this.rearm();
  }

  /**
   * Arms the timer for the earliest deadline of the held locks and backstop of
   * the waits, losing the held locks past their deadline and failing the waits
   * past their backstop. A held lock is lost once its deadline has come, never
   * before, although another lock's deadline may be a moment later (the timer
   * then fires again for it): losing a lock gives it back to the server (see
   * forget), and the server must not grant it to the next waiter before the
   * deadline its holder was told. It once lost every lock due within a
   * millisecond, and a waiter could be granted one before its holder's
   * deadline.
   */
  private rearm(): void {
    clearTimeout(this.clock);
    this.clock = undefined;
    const now = mono();
    let next = Infinity;
    for (const l of this.locks.values()) {
      let at: number;
      if (l.state === 'held') {
        const [d, bySession] = this.deadlineOf(l);
        if (d <= now) {
          this.log(`lock on ${l.resources} given up at its deadline`);
          const id = l._id;
          this.lose(l, lostErrors.deadline(bySession));
          l.lapsed = true;
          this.forget(id);
          continue;
        }
        at = d;
      } else if (l.state === 'waiting' && l.waitEnd) {
        if (l.waitEnd <= now) {
          this.locks.delete(l._id);
          this.forget(l._id);
          l.fail(new MlockError('Lock timeout', 'timeout'), undefined);
          continue;
        }
        at = l.waitEnd;
      } else continue;
      if (at < next) next = at;
    }
    for (let i = 0; i < this.reasks.length; ) {
      const cl = this.reasks[i];
      const l = cl.lock!;
      if (!l.waitEnd) {
        i++;
        continue;
      }
      if (l.waitEnd <= now) {
        this.reasks.splice(i, 1);
        l.state = 'failed';
        l.call = undefined;
        cl.reject?.(new MlockError('Lock timeout', 'timeout'));
        continue;
      }
      if (l.waitEnd < next) next = l.waitEnd;
      i++;
    }
    if (next < Infinity) this.arm(next);
    this.idleCheck();
  }

  /** Forgets l here, ending it with err if it is held. */
  lose(l: Lock, err: MlockError): void {
    if (this.locks.get(l._id) === l) this.locks.delete(l._id);
    l.fail(undefined, err);
  }

  /** Forgets l here and on the server: it is released. */
  private drop(l: Lock): void {
    if (l._id && this.locks.get(l._id) === l) {
      this.locks.delete(l._id);
      this.forget(l._id);
    }
    l.state = 'released';
    this.idleCheck();
  }

  /**
   * The server started a new session although the client had one (it
   * restarted, or the grace passed): held locks are lost; waiting requests
   * held nothing and are asked again with what is left of their timeout.
   */
  private newSession(now: number): void {
    if (this.locks.size) this.log('the server lost this session; its locks are gone');
    for (const [id, l] of this.locks) {
      this.locks.delete(id);
      if (l.state === 'held') l.fail(undefined, lostErrors.session());
      else if (l.state === 'waiting') this.reask(l, now);
    }
  }

  /** Sends a waiting lock's request again on the current connection. */
  private reask(l: Lock, now: number): void {
    const cl = l.call;
    l.call = undefined;
    l._id = '';
    l.confirming = false;
    l.confirms = 0;
    if (!cl) {
      l.state = 'failed';
      return;
    }
    l.state = 'waiting';
    l.call = cl;
    if (!this.connected) {
      this.reasks.push(cl); // on the next connection
      this.rearm();
      return;
    }
    this.resend(cl, now);
  }

  /**
   * Sends again, on the connection just made, the lock requests whose
   * connection dropped before their result. The server may have queued the
   * first request: its grant then arrives for no waiting handle and is given
   * back (see message), so the client never believes it holds a grant it did
   * not ask for on a live connection.
   */
  private reaskCalls(now: number): void {
    const cls = this.reasks;
    this.reasks = [];
    for (const cl of cls) this.resend(cl, now);
  }

  /**
   * Queues cl's lock request again under a new request id, with what is left
   * of its timeout (none left: the wait fails with type timeout).
   */
  private resend(cl: Call, now: number): void {
    const l = cl.lock!;
    l.call = cl;
    if (l.verb === 'lock' && l.timeout > 0) {
      const left = Math.floor(l.waitEnd - this.opts.dialTimeout - now);
      if (left < 1) {
        l.state = 'failed';
        l.call = undefined;
        cl.reject?.(new MlockError('Lock timeout', 'timeout'));
        return;
      }
      l.args[2] = String(left);
    }
    l.state = 'waiting';
    cl.seq = ++this.seq;
    cl.sent = l.sent = now;
    this.calls.set(cl.seq, cl);
    this.queue(`${l.verb} ${cl.seq} ${l.args.join(' ')}`);
  }

  /**
   * After a resume, asks about every waiting request with an extend of its
   * id: a grant (or timeout) pushed to a connection that died would leave it
   * waiting forever.
   */
  private probeWaits(now: number): void {
    for (const l of this.locks.values()) {
      if (l.state !== 'waiting') continue;
      const seq = ++this.seq;
      this.calls.set(seq, { seq, verb: 'extend', sent: now, probe: l });
      this.queue(`extend ${seq} ${l._id} ${l.ttlMs}`);
    }
  }

  /**
   * @internal Sends an extend of waiting lock l, whose grant arrived stale,
   * to its ttl: its answer (see probed) makes l held with a lease that counts
   * from now, or asks again if the grant is gone. If the connection drops
   * first, the resumed session probes l with the same extend.
   */
  confirm(l: Lock, now: number): void {
    const seq = ++this.seq;
    this.calls.set(seq, { seq, verb: 'extend', sent: now, probe: l });
    this.queue(`extend ${seq} ${l._id} ${l.ttlMs}`);
  }

  /**
   * The answer to an extend of waiting lock l sent at sent (after a resume,
   * or to confirm a stale grant). Success on a grant being confirmed makes l
   * held, its lease counting from sent; any other failure of a confirmation
   * gives it back and asks again.
   */
  private probed(l: Lock, ok: boolean, payload: string, sent: number): void {
    if (l.state !== 'waiting' || !l._id || this.locks.get(l._id) !== l) return;
    if (ok && l.confirming) {
      l.base = Math.max(l.base, sent);
      const exp = Number(payload);
      if (exp > 0) l._expiresAt = exp;
      const now = mono();
      if (this.stale(l, now) && l.confirms < MAX_CONFIRMS) {
        // Answered too late to leave minUsable (the answers are held up: a
        // paused server, an election): once more.
        l.confirms++;
        this.confirm(l, now);
        return;
      }
      l.confirming = false;
      l.confirms = 0;
      if (this.stale(l, now)) {
        // Every confirmation came back too late to leave minUsable (or
        // after the lease it gave had ended): a holder must get a lock it
        // can use. Give it back, ask again.
        this.log('a grant could not be confirmed in time; asking again');
        this.locks.delete(l._id);
        this.forget(l._id);
        this.reask(l, now);
        return;
      }
      l.hold();
    } else if (ok || (l.confirming && payload !== 'lock not exist!')) {
      // Granted, but the grant was never announced (or could not be
      // confirmed): give it back, ask again.
      this.log('a grant was not announced, or could not be confirmed; asking again');
      this.locks.delete(l._id);
      this.forget(l._id);
      this.reask(l, mono());
    } else if (payload === 'lock not exist!') {
      this.locks.delete(l._id);
      this.reask(l, mono());
    }
  }

  /** "error server shutting down!": every held lock is gone; waits are asked again on the next session. */
  private shuttingDown(): void {
    this.log('the server is shutting down; its locks are gone');
    for (const [id, l] of this.locks) {
      if (l.state === 'held') {
        this.locks.delete(id);
        l.fail(undefined, lostErrors.shutdown());
      }
    }
  }

  // ---- lock operations ----

  async extend(l: Lock, ttl: number | undefined, signal?: AbortSignal, deadline?: number): Promise<number> {
    if (ttl !== undefined && (!Number.isInteger(ttl) || ttl < 1)) {
      throw new MlockError('ttl should be a whole number of milliseconds > 0', 'request');
    }
    const t = ttl ?? l.ttlMs;
    if (l.state === 'lost') throw l.error!;
    if (l.state !== 'held') throw new MlockError('lock is not held', 'request');
    const sh = this.shorten(l, mono(), t);
    let r: Reply;
    try {
      // A loss meanwhile ends the wait (for a connection, say) at once.
      r = await this.retry('extend', [l._id, String(t)], signal ? AbortSignal.any([signal, l.signal]) : l.signal, { client: l.client, deadline });
    } catch (e) {
      if ((l.state as LockState) === 'lost' && !signal?.aborted) throw l.error!;
      if (e instanceof MlockError && e.reason === 'lock not exist!') {
        this.lose(l, lostErrors.expired());
        throw l.error ?? e;
      }
      if (sh) this.unshorten([[l, sh]], e);
      throw e;
    }
    // Lost while the extend was on its way (its deadline passed, or the
    // server said so): given up, whatever the server answered.
    if ((l.state as LockState) === 'lost') throw l.error!;
    if ((l.state as LockState) !== 'held') throw new MlockError('lock is not held', 'request'); // unlocked meanwhile
    const exp = Number(r.payload);
    l.renewed(r.sent, t, exp);
    return exp;
  }

  async unlock(l: Lock, signal?: AbortSignal, deadline?: number): Promise<void> {
    switch (l.state) {
      case 'released':
      case 'failed':
        return;
      case 'lost':
        throw l.error!;
      case 'waiting':
        if (l.call) this.abandon(l.call);
        return;
    }
    // The first unlock is sent while the lock is believed held.
    const believed = mono() < this.deadline(l);
    // A re-entry answered meanwhile is not this lock (see result).
    l.unlocking = true;
    const id = l._id;
    let retried = false;
    try {
      try {
        await this.call('unlock', [id], signal, undefined, { client: l.client, deadline });
      } catch (e) {
        if (!(e instanceof MlockError && e.type === 'connection' && e.reason !== 'destroyed' && !signal?.aborted && !this.refused)) throw e;
        // Its outcome is unknown: asked again once the connection is back.
        retried = true;
        await this.call('unlock', [id], signal, undefined, { client: l.client, deadline });
      }
    } catch (e) {
      if (e instanceof MlockError && e.reason === 'lock not exist!') {
        // The first unlock, whose answer was lost with the connection, was
        // sent before the deadline, and no word from the server ended the
        // lock since (at most its deadline passed while the unlock waited
        // for the connection: a failover). Either that unlock freed the
        // lock, or the lease ended no earlier than the deadline, after
        // unlock() was called: the holder held it for all its use.
        const st = l.state as LockState;
        if (retried && believed && (st === 'held' || (st === 'lost' && l.lapsed))) {
          // Released, then: unlocking it again resolves (its error keeps the lease's end).
          if (st === 'lost') l.state = 'released';
          return;
        }
        throw lostErrors.expired();
      }
      // Not known to be freed: given back when the connection allows.
      if (l.state === 'held' && this.locks.get(id) === l) this.forget(id);
      throw e;
    } finally {
      l.unlocking = false;
      if (l.state === 'held') {
        this.locks.delete(l._id);
        l.state = 'released';
        this.idleCheck();
      }
    }
  }

  /**
   * Ends what client c waits for and holds: its locks are unlocked on the
   * server (best effort), its held locks lost (client destroyed), its waits
   * failed.
   */
  detach(c: LockOwner): void {
    for (const [id, l] of this.locks) {
      if (l.client !== c) continue;
      this.locks.delete(id);
      this.forget(id);
      l.fail(destroyedError(), lostErrors.destroyed());
    }
    for (const [seq, cl] of this.calls) {
      if (cl.lock && cl.lock.client === c && !cl.abandoned) {
        // Its grant, if it comes, is given back (see result).
        cl.abandoned = true;
        cl.lock.state = 'failed';
        cl.reject?.(destroyedError());
      } else if (!cl.lock && cl.client === c) {
        // Its answer is not waited for.
        this.calls.delete(seq);
        cl.reject?.(destroyedError());
      }
    }
    for (const w of this.upWaiters) {
      if (w.client !== c) continue;
      clearTimeout(w.timer);
      this.upWaiters.delete(w);
      w.reject(destroyedError());
    }
    this.reasks = this.reasks.filter((cl) => {
      if (cl.lock!.client !== c) return true;
      cl.lock!.state = 'failed';
      cl.lock!.call = undefined;
      cl.reject?.(destroyedError());
      return false;
    });
  }

  /** Closes the session (its last client is gone) after flushing what is queued. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.clock);
    clearTimeout(this.pingTimer);
    const e = destroyedError();
    for (const w of this.upWaiters) {
      clearTimeout(w.timer);
      w.reject(e);
    }
    this.upWaiters.clear();
    let pending = 0;
    for (const [seq, cl] of this.calls) {
      if (cl.lock && cl.abandoned) {
        // Its lock id is still to come: it is given back when it does.
        pending++;
        continue;
      }
      this.calls.delete(seq);
      cl.reject?.(e);
    }
    for (const cl of this.reasks) {
      cl.lock!.state = 'failed';
      cl.reject?.(e);
    }
    this.reasks = [];
    for (const [id, l] of this.locks) {
      this.locks.delete(id);
      l.fail(e, lostErrors.destroyed());
    }
    const sock = this.sock;
    if (sock) {
      this.flush();
      if (pending === 0) sock.end();
      // A server that does not answer (or close its end) within a second is cut.
      setTimeout(() => sock.destroy(), 1000).unref();
    }
  }

  /** After close: ends the connection once the lock ids still to come are given back. */
  private endIfDone(): void {
    if (!this.closed || !this.sock) return;
    for (const cl of this.calls.values()) if (cl.lock && cl.abandoned) return;
    this.flush();
    this.sock.end();
  }
}

/** The process's sessions, by address set, credentials and TLS. */
const registry = new Map<string, Session>();

/**
 * Returns the session for o, starting it if needed. Clients of one address
 * set, credentials and TLS setting share a session; a client that names its
 * own socketId gets the session of that socketId (a separate connection).
 */
export function acquireSession(o: Resolved): Session {
  const addrs = o.addrs.map((a) => a.addr).sort();
  // The token is part of the key (hashed): a client with other credentials
  // never rides on another's authenticated session.
  const cred = o.name === undefined ? '' : `${o.name}:${createHash('sha256').update(o.token ?? '').digest('hex')}`;
  const key = JSON.stringify([addrs, cred, o.tls ? JSON.stringify(o.tls) : '', o.socketId ?? '']);
  let s = registry.get(key);
  if (!s || s.closed) {
    for (const other of registry.values()) {
      if (o.socketId !== undefined && other.sid === o.socketId && other.nodes.some((n) => addrs.includes(n.addr))) {
        // Two sessions of one socketId would take each other over.
        throw new MlockError('a client with other addresses, credentials or TLS settings already uses this socketId', 'request');
      }
    }
    s = new Session(key, o, o.socketId);
    registry.set(key, s);
  }
  s.refs++;
  return s;
}

/** Drops one reference to s; the last one closes it. */
export function releaseSession(s: Session): void {
  s.refs--;
  if (s.refs <= 0) {
    if (registry.get(s.key) === s) registry.delete(s.key);
    s.close();
  }
}
