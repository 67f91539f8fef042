package launch_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/syncbuf"
)

// elasticWorker plays a worker of an elastic job: LAUNCH_TEST_STEPS steps
// of one all-reduce each, through every membership, leaving on SIGTERM.
func elasticWorker() int {
	steps, _ := strconv.ParseInt(os.Getenv("LAUNCH_TEST_STEPS"), 10, 64)
	ctx := context.Background()
	m, err := elastic.JoinFromEnv(ctx, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 95
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { <-term; m.LeaveSoon() }()
	var done int64
	for done < steps {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 96
		}
		mb, err := m.Next(ctx, elastic.Report{Step: done, Addr: ln.Addr().String()})
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 97
		}
		done = mb.Step
		fmt.Printf("membership of %d from step %d\n", len(mb.Members), done)
		g, err := collective.New(ctx, mb.Members, mb.Rank, collective.WithListener(ln), collective.WithEpoch(mb.Epoch))
		if err != nil {
			continue
		}
		for done < steps {
			if g.AllReduce(ctx, "step", collective.Sum, collective.Int64, make([]byte, 8)) != nil {
				break
			}
			done++
			time.Sleep(5 * time.Millisecond)
			if change, err := m.Agree(ctx, g, "agree"); err != nil || change {
				break
			}
		}
		_ = g.Close(ctx)
		if m.Leaving() {
			fmt.Println("left")
			return 0
		}
	}
	fmt.Println("done")
	if m.Leave(true) != nil {
		return 98
	}
	return 0
}

// elasticLaunch runs an elastic job of the helper, steps long, with opts.
func elasticLaunch(t *testing.T, steps int, out *syncbuf.Buffer, opts ...launch.Option) (*launch.Launcher, chan error) {
	env := append(os.Environ(), "LAUNCH_TEST_HELPER=elastic", "LAUNCH_TEST_STEPS="+strconv.Itoa(steps))
	l, err := launch.New([]string{os.Args[0]}, append([]launch.Option{launch.WithEnv(env), launch.WithTimeout(testTimeout),
		launch.WithOutput(out, out), launch.WithRestartBackoff(10*time.Millisecond, 10*time.Millisecond)}, opts...)...)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- l.Run(context.Background()) }()
	return l, done
}

func waitOutput(t *testing.T, out *syncbuf.Buffer, s string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), s) }, time.Minute, 5*time.Millisecond, "waiting for %q in:\n%s", s, out)
}

// TestElasticJobReplacesAKilledWorker: a worker of an elastic job killed
// mid-run is started again alone, joins the survivors, and the job ends
// with every worker done.
func TestElasticJobReplacesAKilledWorker(t *testing.T) {
	var out syncbuf.Buffer
	var st starts
	_, done := elasticLaunch(t, 300, &out, launch.WithWorkers(3), launch.WithElastic(2, 3), launch.WithOnStart(st.add))
	waitOutput(t, &out, "[worker:1] membership of 3 from step 0")
	time.Sleep(100 * time.Millisecond)
	worker1 := cluster.Task{Type: cluster.Worker, Index: 1}
	require.NoError(t, syscall.Kill(st.of(worker1)[0].pid, syscall.SIGKILL))
	require.NoError(t, <-done)
	assert.Equal(t, []int{0, 1}, attempts(st.of(worker1)), "the killed worker was started again")
	for i := range 3 {
		assert.Len(t, st.of(cluster.Task{Type: cluster.Worker, Index: i}), 1+boolToInt(i == 1), "worker %d", i)
		assert.Contains(t, out.String(), fmt.Sprintf("[worker:%d] done", i))
	}
}

// TestElasticJobScales: Scale adds a worker to a job of two, then removes
// one, which leaves at a step boundary; the job ends with the others done.
func TestElasticJobScales(t *testing.T) {
	var out syncbuf.Buffer
	l, done := elasticLaunch(t, 600, &out, launch.WithWorkers(2), launch.WithElastic(1, 3))
	waitOutput(t, &out, "[worker:0] membership of 2 from step 0")
	l.Scale(1)
	waitOutput(t, &out, "[worker:0] membership of 3")
	l.Scale(1) // beyond the maximum: refused
	l.Scale(-1)
	waitOutput(t, &out, "[worker:2] left")
	require.NoError(t, <-done)
	assert.Contains(t, out.String(), "[worker:0] done")
	assert.Contains(t, out.String(), "[worker:1] done")
	assert.NotContains(t, out.String(), "[worker:3]")
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestElasticBadOptions(t *testing.T) {
	for _, c := range []struct {
		opts []launch.Option
		want string
	}{
		{[]launch.Option{launch.WithElastic(3, 2), launch.WithWorkers(2)}, "elastic: min workers 3, max workers 2: expected 1 <= min <= max"},
		{[]launch.Option{launch.WithElastic(2, 3), launch.WithWorkers(4)}, "workers: 4, expected between the min and max workers, 2 and 3"},
		{[]launch.Option{launch.WithElastic(1, 2), launch.WithChief(true)}, "an elastic job has workers only"},
		{[]launch.Option{launch.WithElastic(1, 2), launch.WithMaxRestarts(1)}, "--max-restarts restarts a whole cluster"},
		{[]launch.Option{launch.WithElastic(1, 2), launch.WithBasePort(7000)}, "--base-port does not apply to an elastic job"},
	} {
		_, err := launch.New([]string{"x"}, c.opts...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.want)
	}
}
