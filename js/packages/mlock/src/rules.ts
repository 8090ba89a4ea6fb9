// The client's rules for resource names and owners: the Go client's and the
// lock engine's (internal/core CheckName), checked against the shared
// fixture test/fixtures/rules.json by the tests of both clients.

/**
 * Whether name is a valid resource name: not empty, without a space or `|`
 * (the separators of the wire). Any other character is allowed, tabs and
 * other whitespace included. The length is the server's to check
 * (`--max-name-len`, 512 bytes by default).
 */
export function validName(name: unknown): name is string {
  return typeof name === 'string' && name !== '' && name.indexOf(' ') < 0 && name.indexOf('|') < 0;
}

/**
 * Whether owner is a valid owner: the rule of resource names (not empty, no
 * space, no `|`). `*` is the anonymous owner. The server also refuses an
 * owner holding a NUL byte (its scope separator: `invalid owner!`, type
 * `request`) and one longer than `--max-name-len`.
 */
export function validOwner(owner: unknown): owner is string {
  return validName(owner);
}
