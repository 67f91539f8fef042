// Command faulty is the digits program with faults injected on purpose,
// for the tests of internal/cmd/digits only (it lives under testdata, so
// no build of the module's packages includes it): the faults are
// classifier.Faults, as JSON in the environment variable
// TFDIST_TEST_FAULTS, so that every process tfdist launch starts gets
// them.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/tfdist/tfdist/internal/classifier"
)

// envFaults is the variable the tests set (digits' faultsEnv).
const envFaults = "TFDIST_TEST_FAULTS"

func main() {
	var f classifier.Faults
	if v := os.Getenv(envFaults); v != "" {
		dec := json.NewDecoder(bytes.NewReader([]byte(v)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			fmt.Fprintf(os.Stderr, "faulty: %s=%s: %v\n", envFaults, v, err)
			os.Exit(2)
		}
	}
	os.Exit(classifier.MainWithFaults("digits", "mlp", os.Args[1:], os.Stdout, os.Stderr, f))
}
