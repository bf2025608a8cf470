//go:build !crashpoints

// Package crashpoint marks the plugin's state-changing steps (a file
// created, renamed or removed, a rule deleted, a delegate started), so
// that the crash-point tests can kill the process at the k-th of them, for
// every k. In a normal build Step is empty and compiled away; a build with
// -tags crashpoints reads NBC_CRASH_AT and NBC_CRASH_LOG (crashpoint_on.go).
package crashpoint

// Step marks the state change that is about to be made.
func Step(string) {}
