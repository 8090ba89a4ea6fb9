import { asValue } from '@medusajs/framework/awilix';
import type { MlockLockingOptions } from './provider';

/**
 * Registers the provider's options (the `options` of its entry in
 * medusa-config) for its service: the module loader hands the service the
 * Locking Module's options, and the provider's only to its loaders.
 */
export default async function mlockLoader({ container, options }: { container: { register(r: Record<string, unknown>): void }; options?: MlockLockingOptions }): Promise<void> {
  container.register({ mlockLockingOptions: asValue(options ?? {}) });
}
