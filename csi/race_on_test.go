//go:build race

package csi_test

// raceEnabled is true when the tests run with the race detector (go test -race).
const raceEnabled = true
