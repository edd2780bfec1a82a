//go:build race

package main

// raceDetector says the tests run with the race detector, which makes
// every muster process they start several times slower.
const raceDetector = true
