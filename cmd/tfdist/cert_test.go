package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/mtls"
)

// Cert writes a CA and a certificate per task of the TF_CONFIG's cluster,
// each naming its task, readable by its owner only.
func TestCertWritesEveryTask(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	env := map[string]string{"TF_CONFIG": `{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}}`}
	code, out, errOut := runHere(env, "", "cert", "--out", dir, "--job", "job-7", "--lifetime", "2h")
	require.Equal(t, exitOK, code, errOut)
	for _, task := range []cluster.Task{{Type: cluster.Chief}, {Type: cluster.Worker}, {Type: cluster.Worker, Index: 1}} {
		base := filepath.Join(dir, fmt.Sprintf("%s-%d", task.Type, task.Index))
		f := mtls.Files{CA: filepath.Join(dir, "ca.crt"), Cert: base + ".crt", Key: base + ".key"}
		c, err := mtls.Load(f)
		require.NoError(t, err, task)
		assert.Equal(t, mtls.Identity{Job: "job-7", Task: task}, c.Identity())
		assert.Contains(t, out, mtls.EnvCert+"="+f.Cert)
		fi, err := os.Stat(f.Key)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}

	code, _, errOut = runHere(env, "", "cert", "--out", dir)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--out and --job are required")
	code, _, errOut = runHere(env, "", "cert", "--out", dir, "--job", "Job_7")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, `--job: job name "Job_7"`)
	code, _, errOut = runHere(map[string]string{"TF_CONFIG": "{}"}, "", "cert", "--out", dir, "--job", "j")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "names no cluster")
}

// launchedResult runs the classifier on 2 workers under launch with
// extra flags and returns worker 0's result and launch's stderr.
func launchedResult(t *testing.T, flags ...string) (map[string]any, string) {
	t.Helper()
	// Bounds that a loaded machine does not reach: the run takes seconds.
	args := append([]string{"launch", "--workers", "2", "--timeout", "5m"}, flags...)
	args = append(args, "--", os.Args[0], "demo", "-strategy", "multiworker", "-devices", "1", "-steps", "40", "-log-every", "40", "-json")
	cmd, stdout, stderr := tfdist(t, nil, args...)
	require.Equal(t, 0, exitCode(t, cmd, 6*time.Minute), "stderr: %s", stderr)
	m := regexp.MustCompile(`(?m)^\[worker:0\] (\{.*"final_loss".*\})$`).FindStringSubmatch(stdout.String())
	require.NotNil(t, m, stdout.String())
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(m[1]), &res))
	return res, stderr.String()
}

// Under launch --tls the workers train over mutual TLS with certificates
// made for the run, which are gone afterwards, to the plaintext run's
// model; so do they on emulated hosts (--link), across a link rather than
// shared memory; a parameter-server cluster trains under it too.
func TestLaunchTLS(t *testing.T) {
	plain, _ := launchedResult(t)
	secure, stderr := launchedResult(t, "--tls")
	for _, k := range []string{"final_loss", "param_l2", "accuracy"} {
		assert.Equal(t, plain[k], secure[k], k)
	}
	m := regexp.MustCompile(`TLS certificates made for the run.*"dir": "([^"]+)"`).FindStringSubmatch(stderr)
	require.NotNil(t, m, stderr)
	assert.NoDirExists(t, m[1], "launch removes the run's certificates")

	if err := emunet.Available(); err == nil || os.Getenv("CI") != "" {
		linked, stderr := launchedResult(t, "--tls", "--link", "500mbit,1ms")
		for _, k := range []string{"final_loss", "param_l2", "accuracy"} {
			assert.Equal(t, plain[k], linked[k], "%s, on emulated hosts", k)
		}
		assert.Contains(t, stderr, "tasks on emulated hosts")
	}

	cmd, out, errb := tfdist(t, nil, "launch", "--tls", "--chief", "--workers", "1", "--ps", "1", "--timeout", "60s", "--",
		os.Args[0], "demo", "-strategy", "ps", "-devices", "1", "-steps", "10", "-json")
	require.Equal(t, 0, exitCode(t, cmd, 90*time.Second), "stderr: %s", errb)
	assert.Regexp(t, `(?m)^\[chief:0\] \{.*"accuracy"`, out.String(), "the parameter-server job trains under TLS")
}
