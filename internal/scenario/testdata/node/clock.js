'use strict';
// For the suite's own test of the workers' clock (TestNodeClock): for every
// line read from standard input, writes "NS ERROR": the log's time now and
// the error bound of its offset, in ns.
const { nowNs, clock } = require('./common');
const readline = require('node:readline');

readline.createInterface({ input: process.stdin }).on('line', () => {
  process.stdout.write(`${nowNs()} ${clock.error}\n`);
});
