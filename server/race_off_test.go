//go:build !race

package server_test

// raceDetector says the tests run with the race detector, which makes
// the load tests several times costlier: they run smaller under it.
const raceDetector = false
