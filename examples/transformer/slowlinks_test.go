package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/emunet"
)

// BenchmarkSlowLinks's flags: the experiment's setting, small for a smoke
// run, e.g.
//
//	-slow-workers 2 -slow-links 100mbit,20ms -slow-configs sync,diloco:10=2 -slow-steps 100 -slow-log-every 10
var (
	slowLinks   = flag.String("slow-links", "10gbit,0.2ms 100mbit,20ms", "BenchmarkSlowLinks: the emulated links, separated by spaces, each as `tfdist launch --link` takes it")
	slowWorkers = flag.Int("slow-workers", 4, "BenchmarkSlowLinks: the workers, each on an emulated host")
	slowSteps   = flag.Int("slow-steps", 1500, "BenchmarkSlowLinks: S, the steps synchronous training runs")
	slowEvery   = flag.Int("slow-log-every", 100, "BenchmarkSlowLinks: the steps of an epoch, after each of which the weights are saved and scored (a multiple of every H)")
	slowConfigs = flag.String("slow-configs", "sync,fp16=1.2,local-sgd:10=3,diloco:10=3,diloco:50=3,diloco:100=3",
		"BenchmarkSlowLinks: the ways to train, NAME[=F] separated by commas: sync, fp16, local-sgd:H or diloco:H, each run for F·S steps (default 1), rounded up to whole epochs")
	slowOwnSchedule = flag.Bool("slow-own-schedule", false,
		"BenchmarkSlowLinks: decay each run's learning rate over its own steps, instead of over S for every run (-decay-steps S), which gives every run the same rate at every step")
	slowTolerance = flag.Float64("slow-tolerance", 0,
		"BenchmarkSlowLinks: a run reaches the target at a held-out loss up to this fraction above it (0: at or below it; fp16 training's loss at S differs from synchronous training's by rounding, either way)")
	slowArgs    = flag.String("slow-args", "", "BenchmarkSlowLinks: further flags of every transformer run, training and scoring, separated by spaces (e.g. -train-bytes 1MiB)")
	slowDir     = flag.String("slow-dir", "", "BenchmarkSlowLinks: keep each run's output, its -json reports and the tables in `DIR` (default: a temporary directory, removed)")
	slowTimeout = flag.Duration("slow-run-timeout", time.Hour, "BenchmarkSlowLinks: the bound on each training run (tfdist launch --timeout)")
)

// BenchmarkSlowLinks measures, on -slow-workers workers on emulated hosts
// (tfdist launch --link, as root) behind each of -slow-links, each with
// one intra-op thread, what each way of training (-slow-configs) takes to
// reach a fixed held-out loss: synchronous all-reduce, fp16 gradient
// compression, local SGD and DiLoCo with several H.
//
// Each run trains the example (-strategy multiworker, its other flags at
// their defaults but -slow-args) with -save-dir, which saves the weights
// after every epoch of -slow-log-every steps, a multiple of every H, so
// that each save follows a synchronisation and holds the one model every
// worker holds; its -json line gives, for each epoch, the training
// seconds and the bytes worker 0 sent since training began, the saves
// left out. One process then scores every checkpoint of the run on the
// whole held-out text on one device (-evaluate-checkpoint), alike for
// every way: under local SGD and DiLoCo the example's own Evaluate scores
// a worker's model on its own shard.
//
// The target is the held-out loss of synchronous training's last
// checkpoint, after S steps (-slow-steps), on the same link. For each way
// a table gives the first checkpoint at or below it (or above it by at
// most -slow-tolerance, a fraction of it): its step, the
// training seconds and bytes per worker to it, the speed-up over
// synchronous training (its seconds over the way's) and the bytes over
// synchronous training's; or that the way did not reach it in its steps,
// and its best loss. It also gives each way's held-out loss at step S
// against synchronous training's. By default every run's learning rate
// follows the schedule of S steps (warmup, cosine decay to a tenth by S,
// then a tenth), so that runs compare at equal steps; -slow-own-schedule
// decays each over its own steps instead.
//
// fp16 runs the example with -compression fp16 (distribute.Config's),
// local SGD with -local-sgd H and DiLoCo with -diloco H. Run with
// -benchtime 1x; the tables are printed and, with the runs' output,
// written to -slow-dir.
func BenchmarkSlowLinks(b *testing.B) {
	if err := emunet.Available(); err != nil {
		require.Empty(b, os.Getenv("CI"), "CI runs as root: %v", err)
		b.Skip(err)
	}
	configs, err := parseSlowConfigs(*slowConfigs, *slowSteps, *slowEvery)
	require.NoError(b, err)
	links := strings.Fields(*slowLinks)
	require.NotEmpty(b, links, "-slow-links: no link")
	for _, l := range links {
		_, err := emunet.ParseLink(l)
		require.NoError(b, err, "-slow-links")
	}
	require.GreaterOrEqual(b, *slowWorkers, 1, "-slow-workers")
	dir := *slowDir
	if dir == "" {
		dir = b.TempDir()
	}
	bins := b.TempDir()
	x := slowExperiment{
		tfdist:      goBuild(b, bins, "tfdist", "../../cmd/tfdist"),
		transformer: goBuild(b, bins, "transformer", "."),
		dir:         dir,
		args:        strings.Fields(*slowArgs),
	}
	for _, link := range links {
		b.Run("link="+link, func(b *testing.B) {
			for range b.N {
				runs := make([]*slowRun, len(configs))
				for i, c := range configs {
					runs[i] = x.run(b, link, c)
				}
				x.report(b, link, runs)
			}
		})
	}
}

// slowConfig is a way of training BenchmarkSlowLinks measures.
type slowConfig struct {
	name  string   // as -slow-configs gives it: sync, fp16, local-sgd:H, diloco:H
	title string   // as the table gives it
	args  []string // the example's flags that choose it
	steps int      // the steps it runs
}

// parseSlowConfigs reads -slow-configs: NAME[=F], separated by commas,
// with sync among them. Every H must divide every (a multiple of every
// H), and each way runs F·s steps rounded up to a multiple of every.
func parseSlowConfigs(s string, steps, every int) ([]slowConfig, error) {
	if steps < 1 || every < 1 || steps%every != 0 {
		return nil, fmt.Errorf("-slow-steps %d, -slow-log-every %d: expected a positive multiple of a positive number", steps, every)
	}
	var out []slowConfig
	for _, item := range strings.Split(s, ",") {
		name, factor, hasFactor := strings.Cut(strings.TrimSpace(item), "=")
		f := 1.0
		if hasFactor {
			var err error
			if f, err = strconv.ParseFloat(factor, 64); err != nil || f < 1 {
				return nil, fmt.Errorf("-slow-configs %q: %q: expected NAME=F, F a number of times -slow-steps, at least 1", s, item)
			}
		}
		c := slowConfig{name: name, steps: int(math.Ceil(f*float64(steps)/float64(every))) * every}
		kind, h, hasH := strings.Cut(name, ":")
		switch {
		case name == "sync":
			c.title = "synchronous"
		case name == "fp16":
			c.title, c.args = "fp16 compression", []string{"-compression", "fp16"}
		case hasH && (kind == "local-sgd" || kind == "diloco"):
			n, err := strconv.Atoi(h)
			if err != nil || n < 1 || every%n != 0 {
				return nil, fmt.Errorf("-slow-configs %q: %q: expected H a divisor of -slow-log-every %d, so that every save follows a synchronisation", s, item, every)
			}
			c.title, c.args = map[string]string{"local-sgd": "local SGD", "diloco": "DiLoCo"}[kind]+", H = "+h, []string{"-" + kind, h}
		default:
			return nil, fmt.Errorf("-slow-configs %q: %q: expected sync, fp16, local-sgd:H or diloco:H, optionally =F", s, item)
		}
		if slices.ContainsFunc(out, func(o slowConfig) bool { return o.name == name }) {
			return nil, fmt.Errorf("-slow-configs %q: %s twice", s, name)
		}
		out = append(out, c)
	}
	if !slices.ContainsFunc(out, func(c slowConfig) bool { return c.name == "sync" }) {
		return nil, fmt.Errorf("-slow-configs %q: expected sync among them: its loss is the target", s)
	}
	return out, nil
}

// goBuild builds the package at path into dir/name and returns its path.
func goBuild(b *testing.B, dir, name, path string) string {
	bin := filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, path).CombinedOutput()
	require.NoError(b, err, "go build %s:\n%s", path, out)
	return bin
}

// slowExperiment is BenchmarkSlowLinks's binaries and setting.
type slowExperiment struct {
	tfdist, transformer string
	dir                 string   // the runs' outputs
	args                []string // -slow-args
}

// slowRun is one way of training on one link, as measured.
type slowRun struct {
	slowConfig
	train   report          // worker 0's -json report
	loss    map[int]float64 // the held-out loss of each checkpoint, by step
	wall    time.Duration   // launch's whole run, start-up included
	scoring time.Duration   // scoring its checkpoints
}

// run trains c on link and scores its checkpoints.
func (x slowExperiment) run(b *testing.B, link string, c slowConfig) *slowRun {
	r := &slowRun{slowConfig: c}
	out := filepath.Join(x.dir, strings.NewReplacer(",", "_", ":", "").Replace(link), strings.ReplaceAll(c.name, ":", ""))
	ckpts := filepath.Join(out, "checkpoints")
	require.NoError(b, os.RemoveAll(out))
	require.NoError(b, os.MkdirAll(out, 0o755))
	args := slices.Concat([]string{"launch", "--link", link, "--workers", strconv.Itoa(*slowWorkers), "--timeout", slowTimeout.String(),
		"--", x.transformer, "-strategy", "multiworker", "-steps", strconv.Itoa(c.steps), "-log-every", strconv.Itoa(*slowEvery),
		"-sample", "0", "-json", "-save-dir", ckpts}, c.args, x.args)
	if !*slowOwnSchedule {
		args = append(args, "-decay-steps", strconv.Itoa(*slowSteps))
	}
	fmt.Printf("%s, %s: %d steps: tfdist %s\n", link, c.title, c.steps, strings.Join(args, " "))
	cmd := exec.Command(x.tfdist, args...)
	cmd.Env = append(os.Environ(), "TF_NUM_INTRAOP_THREADS=1") // a core a worker, as BenchmarkOnLinks
	start := time.Now()
	stdout := runLogged(b, cmd, out, "train")
	r.wall = time.Since(start)
	line := chiefReport(stdout)
	require.NotEmpty(b, line, "%s: no -json line of worker 0 in %s", c.title, filepath.Join(out, "train.stdout"))
	require.NoError(b, json.Unmarshal([]byte(line), &r.train), "%s: worker 0's -json line", c.title)
	require.NoError(b, os.WriteFile(filepath.Join(out, "train.json"), []byte(line+"\n"), 0o644))

	start = time.Now()
	cmd = exec.Command(x.transformer, slices.Concat([]string{"-evaluate-checkpoint", ckpts, "-sample", "0", "-json"}, x.args)...)
	lines := strings.Split(strings.TrimSpace(runLogged(b, cmd, out, "score")), "\n")
	r.scoring = time.Since(start)
	var score report
	require.NoError(b, json.Unmarshal([]byte(lines[len(lines)-1]), &score), "%s: the scoring's -json line", c.title)
	require.NoError(b, os.WriteFile(filepath.Join(out, "score.json"), []byte(lines[len(lines)-1]+"\n"), 0o644))
	require.NoError(b, os.RemoveAll(ckpts)) // scored: the figures are in score.json
	r.loss = map[int]float64{}
	for _, s := range score.Checkpoints {
		r.loss[int(s.Step)] = s.HeldOutLoss
	}
	require.Len(b, r.loss, len(r.train.Epochs), "%s: a checkpoint for every epoch", c.title)
	last := r.train.Epochs[len(r.train.Epochs)-1]
	fmt.Printf("%s, %s: %d steps in %.1f s of training (%.1f ms a step), %.1f s in all; %s sent by worker 0; held-out loss %.4f; scored in %.1f s\n",
		link, c.title, last.Step, last.Seconds, 1e3*last.Seconds/float64(last.Step), r.wall.Seconds(), bytesText(last.BytesSent),
		r.loss[last.Step], r.scoring.Seconds())
	return r
}

// runLogged runs cmd, its stdout and stderr written to dir/name.stdout
// and dir/name.stderr, and returns its stdout; a failure shows the end of
// both.
func runLogged(b *testing.B, cmd *exec.Cmd, dir, name string) string {
	var stdout, stderr bytes.Buffer
	outFile, err := os.Create(filepath.Join(dir, name+".stdout"))
	require.NoError(b, err)
	defer outFile.Close()
	errFile, err := os.Create(filepath.Join(dir, name+".stderr"))
	require.NoError(b, err)
	defer errFile.Close()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, outFile), io.MultiWriter(&stderr, errFile)
	err = cmd.Run()
	require.NoError(b, err, "%s\nstdout ends:\n%s\nstderr ends:\n%s", cmd, tail(stdout.String(), 20), tail(stderr.String(), 20))
	return stdout.String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// chiefReport returns worker 0's -json line from launch's output, whose
// lines each task's name prefixes.
func chiefReport(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 16<<20)
	line := ""
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "[worker:0] {"); ok {
			line = "{" + rest
		}
	}
	return line
}

// reached is where a run first scored at or below the target.
type reached struct {
	epoch
	ok   bool
	best float64 // the lowest loss of the run, where not reached
}

// reach finds r's first checkpoint at or below target, or above it by at
// most the fraction tolerance.
func (r *slowRun) reach(target, tolerance float64) reached {
	best := math.Inf(1)
	for _, e := range r.train.Epochs {
		loss := r.loss[e.Step]
		if loss <= target*(1+tolerance) {
			return reached{epoch: e, ok: true}
		}
		best = min(best, loss)
	}
	return reached{best: best}
}

// report prints link's table and writes it, with every run's figures, to
// the experiment's directory; it reports each way's speed-up and bytes
// ratio as metrics.
func (x slowExperiment) report(b *testing.B, link string, runs []*slowRun) {
	sync := runs[slices.IndexFunc(runs, func(r *slowRun) bool { return r.name == "sync" })]
	s := sync.train.Epochs[len(sync.train.Epochs)-1].Step
	target := sync.loss[s]
	base := sync.reach(target, *slowTolerance)
	var t strings.Builder
	fmt.Fprintf(&t, "\n%s, %d workers: the target is synchronous training's held-out loss after its %d steps, %.4f nats per character",
		link, *slowWorkers, s, target)
	if *slowTolerance > 0 {
		fmt.Fprintf(&t, ", reached %g%% above it", 100**slowTolerance)
	}
	fmt.Fprintf(&t, "\n\n")
	fmt.Fprintf(&t, "| training | steps run | target reached at step | training time | bytes sent per worker | speed-up | bytes / synchronous's | held-out loss at step %d |\n", s)
	fmt.Fprintf(&t, "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range runs {
		atS := "—"
		if l, ok := r.loss[s]; ok {
			atS = fmt.Sprintf("%.4f (%+.1f%%)", l, 100*(l/target-1))
		}
		steps := r.train.Epochs[len(r.train.Epochs)-1].Step
		g := r.reach(target, *slowTolerance)
		if !g.ok {
			fmt.Fprintf(&t, "| %s | %d | not reached in %d steps (best %.4f, %+.3f%%) | | | | | %s |\n", r.title, steps, steps, g.best, 100*(g.best/target-1), atS)
			continue
		}
		speedup, bytesRatio := base.Seconds/g.Seconds, float64(g.BytesSent)/float64(base.BytesSent)
		fmt.Fprintf(&t, "| %s | %d | %d | %.1f s | %s | %.2f× | %.3f | %s |\n",
			r.title, steps, g.Step, g.Seconds, bytesText(g.BytesSent), speedup, bytesRatio, atS)
		if r != sync {
			b.ReportMetric(speedup, r.name+"_speedup")
			b.ReportMetric(bytesRatio, r.name+"_bytes/sync")
		}
	}
	fmt.Print(t.String())
	name := strings.NewReplacer(",", "_", ":", "").Replace(link)
	require.NoError(b, appendFile(filepath.Join(x.dir, "tables.md"), t.String()))
	figures, err := json.MarshalIndent(slowFigures(runs), "", "  ")
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(filepath.Join(x.dir, name, "figures.json"), figures, 0o644))
}

// slowFigures are the runs' figures as figures.json holds them: each
// way's epochs (step, training seconds, bytes sent, training loss) and
// the held-out loss of its checkpoint after each.
func slowFigures(runs []*slowRun) map[string]any {
	out := map[string]any{}
	for _, r := range runs {
		var epochs []map[string]any
		for _, e := range r.train.Epochs {
			epochs = append(epochs, map[string]any{"step": e.Step, "train_seconds": e.Seconds, "bytes_sent": e.BytesSent,
				"train_loss": e.Loss, "held_out_loss": r.loss[e.Step]})
		}
		out[r.name] = map[string]any{"args": r.args, "steps": r.steps, "wall_seconds": r.wall.Seconds(),
			"save_seconds": r.train.SaveSeconds, "epochs": epochs}
	}
	return out
}

// appendFile appends text to the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

// bytesText gives n bytes in kB, MB or GB (powers of 10).
func bytesText(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.1f kB", float64(n)/1e3)
}

// -slow-configs gives each way its flags and steps, whole epochs of at
// least F·S; a way it cannot run is an error naming the flag.
func TestSlowConfigs(t *testing.T) {
	cs, err := parseSlowConfigs("sync,fp16=1.2,local-sgd:10=3,diloco:50=2.5", 1500, 100)
	require.NoError(t, err)
	require.Equal(t, []slowConfig{
		{name: "sync", title: "synchronous", steps: 1500},
		{name: "fp16", title: "fp16 compression", args: []string{"-compression", "fp16"}, steps: 1800},
		{name: "local-sgd:10", title: "local SGD, H = 10", args: []string{"-local-sgd", "10"}, steps: 4500},
		{name: "diloco:50", title: "DiLoCo, H = 50", args: []string{"-diloco", "50"}, steps: 3800},
	}, cs)
	for s, want := range map[string]string{
		"diloco:10":       "expected sync among them",
		"sync,diloco:30":  `"diloco:30": expected H a divisor of -slow-log-every 100`,
		"sync,adam":       `"adam": expected sync, fp16, local-sgd:H or diloco:H`,
		"sync,fp16=0.5":   `"fp16=0.5": expected NAME=F`,
		"sync,sync=2":     "sync twice",
		"sync,diloco:x=2": `"diloco:x=2": expected H a divisor`,
	} {
		_, err := parseSlowConfigs(s, 1500, 100)
		require.Error(t, err, s)
		require.Contains(t, err.Error(), "-slow-configs "+strconv.Quote(s), s)
		require.Contains(t, err.Error(), want, s)
	}
	_, err = parseSlowConfigs("sync", 150, 100)
	require.ErrorContains(t, err, "-slow-steps 150, -slow-log-every 100")
}
