//go:build race

package locktable

// raceDetector reports whether the tests run under the race detector.
const raceDetector = true
