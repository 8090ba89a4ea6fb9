/**
 * locking-mlock: the mlockd provider of Medusa's Locking Module.
 *
 * In medusa-config:
 *
 *     { resolve: "@medusajs/medusa/locking", options: { providers: [
 *       { resolve: "locking-mlock", id: "locking-mlock", is_default: true,
 *         options: { url: "mlock://localhost:12340" } } ] } }
 */
import { ModuleProvider, Modules } from '@medusajs/framework/utils';
import loader from './loader';
import { MlockLockingProvider } from './provider';

export { MlockLockingProvider };
export type { MlockLockingOptions, ExecuteLease } from './provider';

export default ModuleProvider(Modules.LOCKING, {
  services: [MlockLockingProvider],
  loaders: [loader],
});
