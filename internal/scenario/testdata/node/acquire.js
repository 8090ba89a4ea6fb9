'use strict';
// The Node.js worker of the scenario suite: one process, so one session of
// its own, that acquires its resources with the mlock package, holds them
// and unlocks, writing what it sees to the shared log.
//
//   node acquire.js '{"pkg":"<js/packages/mlock>","uri":"mlock://...","id":"n1",
//                     "resources":"hot","ttl":1000,"hold":300,"timeout":60000,"log":"<file>"}'
//
// Exit status: 0 held for the whole hold and unlocked; 3 the lock was lost
// (on arrival, during the hold, or found gone by the unlock); 4 not granted
// or another error.
const { nowNs, openLog, startSignal, sleep, message } = require('./common');

async function main() {
  const a = JSON.parse(process.argv[2]);
  const log = openLog(a.log, a.id);
  const Mlock = require(a.pkg);
  const client = new Mlock(a.uri);
  try {
    await client.ping();
  } catch (e) {
    log('error', 'ping:', message(e));
    return 4;
  }
  log('ready');
  await startSignal();
  log('ask', a.resources);
  // The event loop's ticks while waiting: the client checks what a grant
  // leaves when it reads it, in a callback after the last tick before the
  // grant; this process, descheduled on a busy machine, may measure much
  // later. The grant line's lag (the time from that tick to the
  // measurement) bounds how much of the belief such a stall took.
  let tick = nowNs();
  const ticker = setInterval(() => {
    tick = nowNs();
  }, 5);
  let lock;
  try {
    lock = await client.acquire(a.resources, { ttl: a.ttl, timeout: a.timeout });
  } catch (e) {
    log('error', 'acquire:', message(e));
    return 4;
  } finally {
    clearInterval(ticker);
  }
  // The grant as it reaches the caller: how long the client believes it held.
  const deadline = lock.deadline;
  const believedNs = deadline === 0 ? 0 : Math.round((deadline - Date.now()) * 1e6);
  const lag = nowNs() - tick;
  log('grant', believedNs, lock.token, a.resources, lag);
  if (!lock.held) {
    log('loss', 'arrival', message(lock.error));
    return 3;
  }
  // The section starts, and later ends, at a moment the lock is seen
  // believed held: the time is read first, then lock.held (which checks the
  // deadline on the monotonic clock) after it.
  let at = nowNs();
  if (!lock.held) {
    log('loss', 'arrival', 'past the deadline at the start of the section:', message(lock.error));
    return 3;
  }
  log.at(at, 'start', lock.token, a.resources);
  const lost = new AbortController();
  lock.lost.then(() => lost.abort());
  await sleep(a.hold, lost.signal);
  at = nowNs();
  if (!lock.held) {
    log('loss', 'hold', message(lock.error));
    return 3;
  }
  log.at(at, 'end', lock.token, a.resources);
  try {
    await lock.unlock();
  } catch (e) {
    log(e && e.type === 'lost' ? 'loss' : 'error', 'unlock', message(e));
    return e && e.type === 'lost' ? 3 : 4;
  }
  log('done');
  client.destroy();
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(4);
  },
);
