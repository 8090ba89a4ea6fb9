// The rules for resource names and owners, against the fixture the Go tests
// read too (test/fixtures/rules.json): the JS client accepts exactly what
// the Go client and the lock engine accept.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import Client, { MlockError, validName, validOwner } from 'mlock';
import { type Server, startServer } from './helpers';

interface Case {
  kind: 'name' | 'owner';
  value: string;
  ok: boolean;
}

const cases = JSON.parse(readFileSync(join(__dirname, '..', '..', 'test', 'fixtures', 'rules.json'), 'utf8')) as Case[];
const show = (c: Case) => `${c.kind} ${JSON.stringify(c.value.length > 40 ? `${c.value.slice(0, 40)}...` : c.value)}`;

describe('the rules fixture', () => {
  test('holds both kinds, accepted and refused values', () => {
    for (const kind of ['name', 'owner'] as const) {
      assert.ok(cases.some((c) => c.kind === kind && c.ok), `an accepted ${kind}`);
      assert.ok(cases.some((c) => c.kind === kind && !c.ok), `a refused ${kind}`);
    }
    // The case that differed: an owner with a tab passes the Go rules.
    assert.ok(cases.some((c) => c.kind === 'owner' && c.value.includes('\t') && c.ok));
  });

  test('validName and validOwner decide as the fixture says', () => {
    for (const c of cases) {
      const got = c.kind === 'name' ? validName(c.value) : validOwner(c.value);
      assert.equal(got, c.ok, show(c));
    }
  });

  test('the client refuses the refused values before sending, type request', async () => {
    // Nothing listens there: a value that passed the check would wait for a
    // connection instead of failing at once.
    const c = new Client({ host: '127.0.0.1', port: 1, dialTimeout: 60000 });
    try {
      for (const x of cases.filter((x) => !x.ok)) {
        const call = x.kind === 'name' ? c.tryLock([x.value]) : c.tryLock(['rules-ok'], { owner: x.value });
        await assert.rejects(call, (e: unknown) => e instanceof MlockError && e.type === 'request', show(x));
        if (x.kind === 'owner') {
          await assert.rejects(c.release(x.value, 'rules-ok'), (e: unknown) => e instanceof MlockError && e.type === 'request', show(x));
          await assert.rejects(c.releaseAll(x.value), (e: unknown) => e instanceof MlockError && e.type === 'request', show(x));
        }
      }
    } finally {
      c.destroy();
    }
  });
});

describe('the accepted values on a server', () => {
  let srv: Server;
  before(async () => {
    srv = await startServer();
  });
  after(async () => {
    await srv.cleanup();
  });

  test('every accepted name and owner within the server’s 512 bytes locks and releases', async () => {
    const c = new Client(`mlock://${srv.addr}`);
    try {
      for (const x of cases.filter((x) => x.ok && Buffer.byteLength(x.value) <= 500)) {
        const name = x.kind === 'name' ? x.value : `rules-${process.pid}`;
        const owner = x.kind === 'owner' ? x.value : `rules-owner-${process.pid}`;
        const l = await c.tryLock([name], { owner, ttl: 5000 });
        assert.equal(l.resources, name, show(x));
        assert.equal(await c.release(owner, [name]), true, show(x));
        assert.equal(l.held, false, show(x));
      }
    } finally {
      c.destroy();
    }
  });
});
