// What the Medusa tests share: loading @medusajs/locking with one provider,
// the path of locking-mlock, a provider's registration. (Not a test file:
// importing Medusa takes seconds, so the other tests do not import it.)
import { join } from 'node:path';
import { MedusaModule } from '@medusajs/framework/modules-sdk';
import type { ILockingModule } from '@medusajs/framework/types';

/** A logger that prints errors only (quiet: true prints nothing). */
export function logger(quiet = false) {
  return { info() {}, warn() {}, error: quiet ? () => {} : console.error, debug() {}, log() {}, activity() {}, progress() {}, failure() {}, success() {}, panic() {}, shouldLog: () => false, setLogLevel() {}, unsetLogLevel() {} };
}

/** The locking-mlock package, as Medusa resolves a provider. */
export const LOCKING_MLOCK = join(__dirname, '..', '..', 'packages', 'locking-mlock');

/** Loads one at a time: MedusaModule's instances are global, and callers may run side by side. */
let loading: Promise<unknown> = Promise.resolve();

/** A fresh @medusajs/locking module with provider as its default. */
export function loadLocking(provider: { resolve: string; id: string; options: Record<string, unknown> }, quiet = false): Promise<ILockingModule> {
  const load = async () => {
    MedusaModule.clearInstances();
    const r = await MedusaModule.bootstrap<ILockingModule>({
      moduleKey: 'locking',
      defaultPath: require.resolve('@medusajs/locking'),
      declaration: { scope: 'internal', resources: 'shared', options: { providers: [{ ...provider, is_default: true }] } } as never,
      injectedDependencies: { logger: logger(quiet) },
    });
    return (r as Record<string, ILockingModule>).locking;
  };
  const p = loading.then(load, load);
  loading = p.catch(() => undefined);
  return p;
}

/** The registration (the provider's instance) of provider id in module m. */
export function registration(m: ILockingModule, id: string): Record<string, unknown> {
  return (m as unknown as { providerService_: { retrieveProviderRegistration(id: string): Record<string, unknown> } }).providerService_.retrieveProviderRegistration(id);
}
