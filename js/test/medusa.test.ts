// The locking-mlock provider loaded into the real @medusajs/locking module
// (Medusa's module loader, no database needed), run through the cases of
// Medusa's locking-redis integration tests and of locking/lockingtest
// (oversell, ownership, re-entry, anonymous "*", release after failure,
// timeout ordering, renewal and loss, opposite orders, scoped releaseAll).
// The upstream cases also run against @medusajs/locking-redis on a real Redis
// when REDIS_URL is set, to show both providers answer them alike.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ILockingModule } from '@medusajs/framework/types';
import { type Proxy, type Server, sleep, startProxy, startServer } from './helpers';
import { LOCKING_MLOCK, loadLocking } from './medusa';

let run = 0;
/** The upstream cases (Medusa's locking-redis integration test), for any provider. */
function upstreamCases(get: () => ILockingModule) {
  const k = (name: string) => `${name}-${process.pid}-${run}`;

  test('should execute functions respecting the key locked (oversell)', async () => {
    const service = get();
    let stock = 5;
    async function buy() {
      if (stock > 0) {
        await sleep(10);
        stock--;
      }
    }
    await Promise.all(Array.from({ length: 10 }, () => buy()));
    assert.equal(stock, -5);
    stock = 5;
    await Promise.all(Array.from({ length: 10 }, () => service.execute(k('item_1'), buy)));
    assert.equal(stock, 0);
  });

  test('should acquire lock and release it', async () => {
    const service = get();
    const key = k('key_name');
    await service.acquire(key, { ownerId: 'user_id_123' });
    assert.equal(await service.release(key, { ownerId: 'user_id_456' }), false);
    await assert.rejects(service.acquire(key, { ownerId: 'user_id_456' }), { message: `Failed to acquire lock for key "${key}"` });
    assert.equal(await service.release(key, { ownerId: 'user_id_123' }), true);
  });

  test('should acquire lock and release it during parallel calls', async () => {
    const service = get();
    const key = k('mySpecialKey');
    const user1 = { ownerId: 'user_id_456' };
    const user2 = { ownerId: 'user_id_000' };
    await Promise.all([service.acquire(key, user1), service.acquire(key, user1)]);
    const rs = await Promise.allSettled([service.acquire(key, user2), service.acquire(key, user2)]);
    for (const x of rs) {
      assert.equal(x.status, 'rejected');
      assert.equal((x as PromiseRejectedResult).reason.message, `Failed to acquire lock for key "${key}"`);
    }
    await service.acquire(key, user1);
    assert.equal(await service.release(key, user2), false);
    assert.equal(await service.release(key, user1), true);
  });

  test('should fail to acquire the same key when no owner is provided', async () => {
    const service = get();
    const key = k('mySpecialKey2');
    const user2 = { ownerId: 'user_id_000' };
    await service.acquire(key);
    const rs = await Promise.allSettled([service.acquire(key), service.acquire(key), service.acquire(key, user2), service.acquire(key, user2)]);
    assert.deepEqual(rs.map((x) => x.status), ['rejected', 'rejected', 'rejected', 'rejected']);
    assert.equal(await service.release(key, user2), false);
    assert.equal(await service.release(key), true);
  });

  test('should release lock in case of failure', async () => {
    const service = get();
    const key = k('lock_key');
    let calls1 = 0;
    let calls2 = 0;
    const fn1 = async () => {
      calls1++;
      throw new Error('Error');
    };
    const fn2 = async () => {
      calls2++;
    };
    await service.execute(key, fn1).catch(() => undefined);
    await service.execute(key, fn2).catch(() => undefined);
    assert.equal(calls1, 1);
    assert.equal(calls2, 1);
  });

  test('should release lock in case of timeout failure', async () => {
    const service = get();
    const key = k('lock_key_t');
    let calls2 = 0;
    const fn1 = async () => {
      await sleep(1010);
      return 'fn_1';
    };
    const fn2 = async () => {
      calls2++;
      return 'fn_2';
    };
    const fn3 = async () => 'fn_3';
    const ops = [service.execute(key, fn1, { timeout: 1 }), service.execute(key, fn2, { timeout: 1 }), service.execute(key, fn3, { timeout: 5 })];
    const res = await Promise.allSettled(ops);
    assert.deepEqual(
      res.map((x) => (x.status === 'fulfilled' ? x.value : (x.reason as Error).message)),
      ['fn_1', 'Timed-out acquiring lock.', 'fn_3'],
    );
    assert.equal(calls2, 0);
  });

  test('should hold the keys until the job is done', async () => {
    const service = get();
    const key = k('held_key');
    await service.execute(key, async () => {
      await assert.rejects(service.acquire(key, { ownerId: 'someone_else' }), { message: `Failed to acquire lock for key "${key}"` });
    });
    await service.acquire(key, { ownerId: 'someone_else', expire: 5 });
    assert.equal(await service.release(key, { ownerId: 'someone_else' }), true);
  });
}

describe('locking-mlock in @medusajs/locking', () => {
  let srv: Server;
  let proxy: Proxy;
  let service: ILockingModule;
  before(async () => {
    srv = await startServer(['--session-grace', '3s']);
    proxy = await startProxy(srv.port);
    service = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${srv.addr}` } });
    run++;
  });
  after(async () => {
    await proxy.close();
    await srv.cleanup();
  });

  upstreamCases(() => service);
  const k = (name: string) => `${name}-${process.pid}-mlock`;

  test('is registered under its identifier and is the default provider', async () => {
    // The module names the provider by id: execute through it explicitly too.
    assert.equal(await service.execute(k('by-id'), async () => 'ok', { provider: 'locking-mlock' } as never), 'ok');
  });

  test('should re-enter a lock held by the same owner when awaitQueue is set', async () => {
    const key = k('reentrant_key');
    await service.acquire(key, { ownerId: 'owner_reentry', expire: 10 });
    await service.acquire(key, { ownerId: 'owner_reentry', expire: 10, awaitQueue: true } as never);
    assert.equal(await service.release(key, { ownerId: 'owner_reentry' }), true);
  });

  test('should scope releaseAll to the given owner', async () => {
    const [mine, theirs] = [k('ra_mine'), k('ra_theirs')];
    await service.acquire(mine, { ownerId: 'owner_a' });
    await service.acquire(theirs, { ownerId: 'owner_b' });
    await service.releaseAll({ ownerId: 'owner_a' });
    await service.acquire(mine, { ownerId: 'owner_c' });
    await assert.rejects(service.acquire(theirs, { ownerId: 'owner_c' }), { message: `Failed to acquire lock for key "${theirs}"` });
    assert.equal(await service.release(mine, { ownerId: 'owner_c' }), true);
    assert.equal(await service.release(theirs, { ownerId: 'owner_b' }), true);
  });

  test('should not deadlock when two callers request the same keys in opposite orders', async () => {
    const [a, b] = [k('abba_a'), k('abba_b')];
    await service.acquire(b, { ownerId: 'holder', expire: 10 });
    const t0 = Date.now();
    const one = service.acquire([a, b], { ownerId: 'one', expire: 10, awaitQueue: true } as never).then(() => service.release([a, b], { ownerId: 'one' }));
    const two = service.acquire([b, a], { ownerId: 'two', expire: 10, awaitQueue: true } as never).then(() => service.release([b, a], { ownerId: 'two' }));
    await sleep(150);
    assert.equal(await service.release(b, { ownerId: 'holder' }), true);
    assert.deepEqual(await Promise.all([one, two]), [true, true]);
    assert.ok(Date.now() - t0 < 2000);
  });

  test('a multi-key acquire takes all keys or none', async () => {
    const [free, busy] = [k('free'), k('busy')];
    await service.acquire(busy, { ownerId: 'another-owner', expire: 60 });
    await assert.rejects(service.acquire([free, busy], { ownerId: 'me' }), { message: `Failed to acquire lock for key "${busy}"` });
    // Nothing of the failed attempt is held.
    await service.acquire(free, { ownerId: 'third', expire: 5 });
    assert.equal(await service.release(free, { ownerId: 'third' }), true);
    let called = false;
    await assert.rejects(
      service.execute([free, busy], async () => {
        called = true;
      }, { timeout: 1 }),
      { message: 'Timed-out acquiring lock.' },
    );
    assert.equal(called, false);
    await service.acquire(free, { ownerId: 'third', expire: 5 });
    assert.equal(await service.release(free, { ownerId: 'third' }), true);
    assert.equal(await service.release(busy, { ownerId: 'another-owner' }), true);
  });

  test('execute renews the lease while the job runs past it', async () => {
    const key = k('renewed');
    const r = await service.execute(key, async (signal) => {
      await sleep(3000); // 1.5 leases: renewed at least twice
      assert.equal(signal?.aborted, false);
      await assert.rejects(service.acquire(key, { ownerId: 'intruder' }));
      return 'done';
    }, { expire: 2 });
    assert.equal(r, 'done');
    await service.acquire(key, { ownerId: 'intruder', expire: 5 });
    assert.equal(await service.release(key, { ownerId: 'intruder' }), true);
  });

  test('keys with spaces and "|" are locked as given', async () => {
    const key = `odd key|${process.pid}%`;
    await service.acquire(key, { ownerId: 'owner with space' });
    await assert.rejects(service.acquire(key, { ownerId: 'x' }), { message: `Failed to acquire lock for key "${key}"` });
    assert.equal(await service.release(key, { ownerId: 'owner with space' }), true);
  });

  test('execute throws a CONFLICT error when its job kept the event loop busy past the lease', async () => {
    const key = k('blocked');
    const p = service.execute(key, async () => {
      // Synchronous work past the lease (1 s, counted from before the job started): no timer runs meanwhile.
      const end = Date.now() + 1100;
      for (let i = 0; i < 1e9 && Date.now() <= end; i++);
      return 'finished';
    }, { expire: 1 });
    await assert.rejects(p, (e: Error & { type?: string }) => e.type === 'conflict' && /Lost the lock/.test(e.message));
  });

  test('execute aborts the job when the lock is lost, and throws a CONFLICT error', async () => {
    // A provider of its own, through a proxy that goes silent.
    const lossy = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${proxy.addr}` } });
    const key = k('lost');
    let aborted: unknown;
    const p = lossy.execute(key, async (signal) => {
      proxy.blackhole(true);
      if (!signal!.aborted) await new Promise<void>((res) => signal!.addEventListener('abort', () => res()));
      aborted = signal!.reason;
      return 'finished anyway';
    }, { expire: 1 });
    await assert.rejects(p, (e: Error & { type?: string }) => e.type === 'conflict' && /Lost the lock/.test(e.message));
    assert.ok(aborted instanceof Error);
    proxy.blackhole(false);
    proxy.cut();
    // Restore the shared module for later tests.
    service = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${srv.addr}` } });
  });

  test('a job that declares no parameter gets no signal, and still sees the loss thrown', async () => {
    // A job that can read its arguments gets an AbortSignal; one declared
    // `async () =>` cannot, and gets none (the interface types it optional).
    const got: unknown[] = [];
    await service.execute(k('sig-1'), async (signal) => void got.push(signal));
    await service.execute(k('sig-2'), async function () {
      // eslint-disable-next-line prefer-rest-params
      got.push(arguments[0]);
    });
    await service.execute(k('sig-3'), async (...args: unknown[]) => void got.push(args[0]));
    await service.execute(k('sig-4'), async () => void got.push('none'));
    assert.ok(got[0] instanceof AbortSignal && got[1] instanceof AbortSignal && got[2] instanceof AbortSignal, `${got}`);
    assert.equal(got[3], 'none');
    // Its lock lost while it awaits (the server goes silent past the lease):
    // execute throws the loss when it returns, as with a signal.
    const lossy = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${proxy.addr}` } });
    const p = lossy.execute(k('sig-lost'), async () => {
      proxy.blackhole(true);
      await sleep(1500);
      return 'finished';
    }, { expire: 1 });
    await assert.rejects(p, (e: Error & { type?: string }) => e.type === 'conflict' && /Lost the lock/.test(e.message));
    proxy.blackhole(false);
    proxy.cut();
    service = await loadLocking({ resolve: LOCKING_MLOCK, id: 'locking-mlock', options: { url: `mlock://${srv.addr}` } });
  });
});

describe('@medusajs/locking-redis in @medusajs/locking (same upstream cases)', { skip: process.env.REDIS_URL ? false : 'REDIS_URL is not set' }, () => {
  let service: ILockingModule;
  before(async () => {
    service = await loadLocking({ resolve: require.resolve('@medusajs/locking-redis'), id: 'locking-redis', options: { redisUrl: process.env.REDIS_URL, namespace: `jstest_${process.pid}:` } });
    run++;
  });
  after(async () => {
    // ioredis keeps the process alive: close the provider's connection.
    const providers = (service as unknown as { providerService_: { retrieveProviderRegistration(id: string): { redisClient: { disconnect(): void } } } }).providerService_;
    providers.retrieveProviderRegistration('locking-redis').redisClient.disconnect();
  });
  upstreamCases(() => service);
});
