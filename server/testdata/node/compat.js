// A Node.js client that speaks to mlockd exactly as the original mlock client
// (0.1.10 / 0.2.0) does on the wire: packet-wrapper framing, "connect
// <socketId> 1.0", random hex request ids, lock arguments joined with spaces
// (an unset ttl becomes an empty field), a ping timer, and a reconnect with the
// same socketId. It runs the scenarios below against the address in argv[2]
// and exits non-zero on the first failure.
'use strict';
const net = require('net');
const assert = require('assert');

const [host, port] = process.argv[2].split(':');
const hexId = () => Math.random().toString(16).substr(2);

function frame(text) {
  const body = Buffer.from(text);
  const out = Buffer.alloc(body.length + 5);
  out.writeInt32BE(body.length + 5, 0);
  body.copy(out, 4);
  out[out.length - 1] = 0x0a;
  return out;
}

class Conn {
  constructor(socketId) {
    this.id = socketId || hexId();
    this.pending = new Map(); // request id -> {resolve, reject}
    this.waits = new Map(); // lock id -> {resolve, reject}
    this.seen = [];
    this.pings = 0;
  }
  open() {
    return new Promise((resolve, reject) => {
      this.buf = Buffer.alloc(0);
      this.sock = net.createConnection({ host, port: Number(port) }, () => this.write(`connect ${this.id} 1.0`));
      this.sock.on('data', (chunk) => this.onData(chunk));
      this.sock.on('error', () => {});
      this.onConnected = resolve;
      this.onError = reject;
    });
  }
  write(text) { this.sock.write(frame(text)); }
  // One packet per macrotask, as the original client does (setImmediate
  // between packets), so promise continuations run between a lock's result
  // and its locked push.
  onData(chunk) {
    this.buf = Buffer.concat([this.buf, chunk]);
    if (!this.draining) this.drain();
  }
  drain() {
    this.draining = false;
    if (this.buf.length < 4) return;
    const len = this.buf.readInt32BE(0);
    if (this.buf.length < len) return;
    const text = this.buf.slice(4, len - 1).toString();
    this.buf = this.buf.slice(len);
    this.onMessage(text);
    this.draining = true;
    setImmediate(() => this.drain());
  }
  onMessage(text) {
    this.seen.push(text);
    const args = text.split(' ');
    const cmd = args.shift().toLowerCase();
    switch (cmd) {
      case 'connected':
        clearInterval(this.timer);
        this.timer = setInterval(() => this.send('ping', []).then(() => this.pings++), 100);
        this.onConnected();
        break;
      case 'error':
        this.onError(Object.assign(new Error(args.join(' ')), { type: 'connection' }));
        break;
      case 'result': {
        const [req, ok, ...rest] = args;
        const p = this.pending.get(req);
        if (!p) return;
        this.pending.delete(req);
        const payload = rest.join(' ');
        if (ok === 'success') p.resolve(payload);
        else p.reject(Object.assign(new Error(payload), { type: payload === 'can not tolerate!' ? 'tolerate' : 'request' }));
        break;
      }
      case 'locked': {
        const w = this.waits.get(args[0]);
        if (w) { this.waits.delete(args[0]); w.resolve(args[0]); }
        break;
      }
      case 'timeout': {
        const w = this.waits.get(args[0]);
        if (w) { this.waits.delete(args[0]); w.reject(Object.assign(new Error('Lock timeout'), { type: 'timeout' })); }
        break;
      }
      case 'expired':
        break;
      default:
        throw new Error('unknown message ' + text);
    }
  }
  send(cmd, args) {
    const req = hexId();
    return new Promise((resolve, reject) => {
      this.pending.set(req, { resolve, reject });
      this.write([cmd, req].concat(args).join(' '));
    });
  }
  async lock(resource, ttl, timeout, tolerate) {
    const id = await this.send('lock', [resource, ttl, timeout || 0, tolerate || 0]);
    // The locked push may already have been read in the same chunk: register
    // the wait before the next macrotask, as the original client does.
    return { id, granted: new Promise((resolve, reject) => this.waits.set(id, { resolve, reject })) };
  }
  extend(id, ttl) { return this.send('extend', [id, ttl]).then((r) => parseInt(r)); }
  unlock(id) { return this.send('unlock', [id]); }
  close() { clearInterval(this.timer); this.sock.destroy(); }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const a = new Conn();
  const b = new Conn();
  await a.open();
  await b.open();

  // Quick start: lock with no ttl (empty field) gets the default, then unlock.
  let l = await a.lock('product:1001|product:1002', undefined);
  await l.granted;
  assert.strictEqual(await a.unlock(l.id), 'done');

  // The literal word "undefined" is a missing ttl too.
  const id = await a.send('lock', ['w', 'undefined', 0, 0]);
  await new Promise((resolve) => a.waits.set(id, { resolve }));
  assert.strictEqual(await a.unlock(id), 'done');

  // ping and status.
  assert.strictEqual(await a.send('ping', []), 'pong');
  const st = JSON.parse(await a.send('status', []));
  for (const k of ['socketCount', 'currentLocks', 'liveTime']) assert.strictEqual(typeof st[k], 'number', k);

  // Contention and FIFO across two connections; extend returns a number.
  // Leases of a minute: none ends before the test unlocks it, on a busy
  // machine too.
  const h = await a.lock('sku:1', 60000);
  await h.granted;
  const w1 = await b.lock('sku:1|sku:2', 60000);
  const w2 = await b.lock('sku:2', 60000);
  const order = [];
  w1.granted.then(() => order.push('w1'));
  w2.granted.then(() => order.push('w2'));
  const exp = await a.extend(h.id, 60000);
  assert.ok(Number.isInteger(exp) && exp > Date.now());
  await a.unlock(h.id);
  await w1.granted;
  await b.unlock(w1.id);
  await w2.granted;
  assert.deepStrictEqual(order, ['w1', 'w2']);
  await b.unlock(w2.id);

  // tolerate and timeout errors.
  const t0 = await a.lock('hot', 60000);
  await t0.granted;
  const t1 = await b.lock('hot', 60000, 0, 1);
  await assert.rejects(b.lock('hot', 60000, 0, 1), (e) => e.type === 'tolerate' && e.message === 'can not tolerate!');
  await b.unlock(t1.id);
  const t2 = await b.lock('hot', 60000, 100);
  await assert.rejects(t2.granted, (e) => e.type === 'timeout');
  await assert.rejects(a.send('lock', ['hot', '0', 0, 0]), (e) => e.type === 'request' && e.message === 'ttl should be integer!');

  // Reconnect with the same socketId while waiting: the grant is replayed.
  const sid = hexId();
  const c = new Conn(sid);
  await c.open();
  const cw = await c.lock('hot', 60000);
  c.close();
  await sleep(50);
  await a.unlock(t0.id); // granted while c is offline
  await sleep(300);
  const c2 = new Conn(sid);
  c2.waits = c.waits; // the same client object keeps its waits across a reconnect
  await c2.open();
  await cw.granted;
  await c2.unlock(cw.id);

  // The ping timer ran during all this without upsetting the server.
  assert.ok(a.pings > 0, 'no ping answered');
  for (const conn of [a, b, c2]) {
    for (const m of conn.seen) assert.ok(/^(connected|result|locked|timeout|expired) /.test(m), 'unexpected message ' + m);
    conn.close();
  }
  await burst();
  console.log('node compat: ok');
}

// 20 clients of one host, each with its own connection, opened together
// (the client does not retry a refused connect: every one must be let in),
// then each locking 50 times on 5 shared resources, two at a time. No two
// hold a resource at once.
async function burst() {
  const clients = Array.from({ length: 20 }, () => new Conn());
  await Promise.all(clients.map((c) => c.open()));
  const holder = new Map(); // resource -> client index
  let cycles = 0;
  await Promise.all(clients.map(async (c, i) => {
    for (let j = 0; j < 50; j++) {
      const res = [`shared:${(i + j) % 5}`, `shared:${(i + j + 1) % 5}`];
      const l = await c.lock(res.join('|'), 60000, 120000); // leases and waits far past a busy machine's delays
      await l.granted;
      for (const r of res) {
        assert.ok(!holder.has(r), `${r} granted to client ${i} while client ${holder.get(r)} holds it`);
        holder.set(r, i);
      }
      await new Promise((r) => setImmediate(r));
      for (const r of res) holder.delete(r);
      assert.strictEqual(await c.unlock(l.id), 'done');
      cycles++;
    }
  }));
  assert.strictEqual(cycles, 20 * 50);
  for (const c of clients) {
    for (const m of c.seen) assert.ok(/^(connected|result|locked) /.test(m), 'unexpected message ' + m);
    c.close();
  }
}

main().catch((e) => {
  console.error('node compat failed:', e);
  process.exit(1);
});
