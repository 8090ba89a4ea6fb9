'use strict';
// The Medusa worker of the scenario suite: one process that loads Medusa's
// Locking Module (@medusajs/locking, through Medusa's own module loader)
// with the locking-mlock provider, as a Medusa application does, and runs
// one checkout: execute(keys, job, { expire: 1 }), the job holding the keys
// for a while.
//
//   node medusa.js '{"js":"<js/>","uri":"mlock://...","id":"m1","keys":["product:1","product:2"],
//                    "expire":1,"hold":300,"timeout":60,"log":"<file>"}'
//
// The provider's job gets no lock handle: to log how long the grant is
// believed held when it arrives, the mlock client's acquire (the one the
// provider loads) is wrapped here to log each grant as it resolves.
//
// Exit status: 0 the job ran whole under its lock; 3 the lock was lost
// (the job's signal aborted, or execute threw the loss); 4 not granted or
// another error.
const path = require('node:path');
const { createRequire } = require('node:module');
const { nowNs, openLog, startSignal, sleep, message } = require('./common');

const logger = { info() {}, warn: (m) => console.error(m), error: console.error, debug() {}, log() {}, activity() {}, progress() {}, failure() {}, success() {}, panic() {}, shouldLog: () => false, setLogLevel() {}, unsetLogLevel() {} };

async function main() {
  const a = JSON.parse(process.argv[2]);
  const log = openLog(a.log, a.id);
  const providerDir = path.join(a.js, 'packages', 'locking-mlock');
  const jsRequire = createRequire(path.join(a.js, 'package.json'));

  // The mlock client as the provider loads it.
  const Mlock = createRequire(path.join(providerDir, 'package.json'))('mlock');
  let token = 0;
  let granted; // the lock of the last grant: the job checks it is still believed held
  let arrivedLost = false;
  const acquire = Mlock.prototype.acquire;
  Mlock.prototype.acquire = function (...args) {
    return acquire.apply(this, args).then((lock) => {
      const deadline = lock.deadline;
      token = lock.token;
      granted = lock;
      log('grant', deadline === 0 ? 0 : Math.round((deadline - Date.now()) * 1e6), lock.token, lock.resources);
      if (!lock.held) {
        arrivedLost = true;
        log('loss', 'arrival', message(lock.error));
      }
      return lock;
    });
  };

  const { MedusaModule } = jsRequire('@medusajs/framework/modules-sdk');
  const r = await MedusaModule.bootstrap({
    moduleKey: 'locking',
    defaultPath: jsRequire.resolve('@medusajs/locking'),
    declaration: { scope: 'internal', resources: 'shared', options: { providers: [{ resolve: providerDir, id: 'locking-mlock', is_default: true, options: { url: a.uri } }] } },
    injectedDependencies: { logger },
  });
  const service = r.locking;
  try {
    // Connects the provider's client (a release of a key nobody holds).
    await service.release(`warmup-${a.id}`);
  } catch (e) {
    log('error', 'connect:', message(e));
    return 4;
  }
  log('ready');
  await startSignal();
  const keys = a.keys.join('|');
  log('ask', keys);
  let lostInJob = false;
  try {
    await service.execute(
      a.keys,
      async (signal) => {
        // The section starts, and later ends, at a moment the lock is seen
        // believed held: the time is read first, then the signal and
        // lock.held (the deadline on the monotonic clock: the signal's timer
        // may not have run yet) after it.
        let at = nowNs();
        if (arrivedLost || signal.aborted) return;
        if (!granted || !granted.held) {
          arrivedLost = true;
          log('loss', 'arrival', 'past the deadline at the start of the section:', message(granted && granted.error));
          return;
        }
        log.at(at, 'start', token, keys);
        await sleep(a.hold, signal);
        at = nowNs();
        if (signal.aborted || !granted.held) {
          lostInJob = true;
          log('loss', 'hold', message(signal.aborted ? signal.reason : granted.error));
          return;
        }
        log.at(at, 'end', token, keys);
      },
      { expire: a.expire, timeout: a.timeout },
    );
  } catch (e) {
    if (arrivedLost || lostInJob) return 3;
    const lost = /Lost the lock/.test(String(e && e.message));
    log(lost ? 'loss' : 'error', 'execute', message(e));
    return lost ? 3 : 4;
  }
  if (arrivedLost || lostInJob) return 3;
  log('done');
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(4);
  },
);
