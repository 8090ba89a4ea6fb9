'use strict';
// Shared by the Node.js workers of the scenario suite: the shared log (one
// write per line to a file opened for appending) and the start signal (the
// test closes the worker's standard input once every worker is ready).
const fs = require('node:fs');

// Wall clock in ns with sub-millisecond precision: performance.timeOrigin is
// the wall clock at the start of the process, performance.now() the
// monotonic time since. TestNodeClock checks that it compares with the Go
// processes' wall clock.
function nowNs() {
  const ms = performance.timeOrigin + performance.now();
  return BigInt(Math.floor(ms)) * 1000000n + BigInt(Math.round((ms % 1) * 1e6));
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

module.exports = { nowNs, openLog, startSignal, sleep, message };
