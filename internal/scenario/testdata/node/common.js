'use strict';
// Shared by the Node.js workers of the scenario suite: the shared log (one
// write per line to a file opened for appending) and the start signal (the
// test closes the worker's standard input once every worker is ready).
const fs = require('node:fs');

// The wall clock in ns with sub-millisecond precision, comparable with the
// other processes' lines: the monotonic clock (process.hrtime) plus its
// offset from the wall clock, measured here at the edges of Date.now()'s
// milliseconds. At an edge, the first read of the new millisecond w comes
// after the wall clock reached w and the last read of the one before came
// before: the hrtime read just after bounds the offset from below, the one
// just before from above. Five edges, the tightest bounds, the middle: off
// by a few microseconds unless every edge was interrupted (clock.error
// bounds it). Not performance.timeOrigin + performance.now(): the origin's
// wall and monotonic readings are taken apart when the process starts, and
// a start descheduled between them puts every later time off by as long. In
// a run of the node scenario on a loaded machine one worker's times were
// about 65 ms ahead (its grant logged 69 ms after the servers applied it,
// the unlock that its end line precedes applied 62 ms before that line),
// and its section seemed to overlap the next holder's by 55 ms.
function calibrate() {
  let lo = -(1n << 62n);
  let hi = 1n << 62n;
  for (let k = 0; k < 5; k++) {
    let before = process.hrtime.bigint(); // followed by a Date.now() still at w0
    const w0 = Date.now();
    let w, after;
    for (;;) {
      const h = process.hrtime.bigint();
      w = Date.now();
      if (w !== w0) {
        after = process.hrtime.bigint();
        break;
      }
      before = h;
    }
    // At after, the wall clock was at least w; at before, below w0 + 1.
    if (BigInt(w) * 1000000n - after > lo) lo = BigInt(w) * 1000000n - after;
    if (BigInt(w0 + 1) * 1000000n - before < hi) hi = BigInt(w0 + 1) * 1000000n - before;
  }
  return { offset: (lo + hi) / 2n, error: (hi - lo) / 2n };
}
const clock = calibrate();

function nowNs() {
  return process.hrtime.bigint() + clock.offset;
}

// openLog returns log(kind, ...fields), which writes a line with the time
// now, and log.at(ns, kind, ...fields), which writes it with the time ns (a
// section's start and end are logged with the time their lock was last seen
// believed held: the process may be descheduled before it writes the line).
function openLog(path, id) {
  const fd = fs.openSync(path, 'a');
  const at = (ns, kind, ...fields) => {
    const line = [kind, id, ns.toString(), ...fields.map((f) => String(f).replace(/\n/g, ' '))].join(' ') + '\n';
    fs.writeSync(fd, line);
  };
  const log = (kind, ...fields) => at(nowNs(), kind, ...fields);
  log.at = at;
  if (clock.error > 1000000n) {
    console.error(`clock: the wall clock's offset is known to ${Number(clock.error) / 1e6} ms only`);
  }
  return log;
}

function startSignal() {
  return new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('error', resolve);
    process.stdin.resume();
  });
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    });
  });

const message = (e) => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));

module.exports = { nowNs, clock, openLog, startSignal, sleep, message };
