// Package archtest holds tests of tfdist's architecture as a whole: which
// packages may import which. It has no code of its own.
package archtest
