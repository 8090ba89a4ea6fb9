// Package buildinfo holds the version of this build of mlock: the one value
// the client, the server and the command line all report. It imports
// nothing of the module.
package buildinfo

// Version is the version of this build (the release tag without its "v";
// "-dev" between releases): what `mlockd --version` prints and the status
// command reports. CHANGELOG.md lists the releases.
const Version = "0.2.0-dev"
