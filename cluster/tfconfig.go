package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// EnvVar is the environment variable TensorFlow reads its cluster from.
const EnvVar = "TF_CONFIG"

// RPCLayerGRPC is the only RPC layer TensorFlow's distributed runtime serves
// in tfdist, and the default when TF_CONFIG names none.
const RPCLayerGRPC = "grpc"

// TFConfig is a parsed TF_CONFIG: the cluster, this process's task in it and
// the optional fields TensorFlow reads.
type TFConfig struct {
	// Cluster is the "cluster" field; empty for a local program.
	Cluster ClusterSpec
	// Task is the "task" field; the zero Task when TF_CONFIG has none,
	// which only a local program (empty Cluster) may leave out.
	Task Task
	// RPCLayer is the "rpc_layer" field as written: "" or "grpc".
	RPCLayer string
	// Environment is the "environment" field as written (TensorFlow knows
	// "cloud" and "google"; tfdist only carries it).
	Environment string
	// SessionMaster is the "session_master" field as written: the session
	// target TensorFlow 1.x programs use instead of their own task's.
	SessionMaster string
	// IgnoredKeys lists, sorted, the keys ParseTFConfig found that
	// TF_CONFIG does not define ("task.foo" for a key inside "task").
	// TensorFlow ignores them too; a misspelt "cluster" is the usual
	// reason to look. Marshal does not write them.
	IgnoredKeys []string
}

// LoadTFConfig parses the TF_CONFIG environment variable. It returns an error
// wrapping ErrNoTFConfig when the variable is unset or blank, and a
// *ValidationError when it is malformed.
func LoadTFConfig() (*TFConfig, error) {
	v, ok := os.LookupEnv(EnvVar)
	if !ok || strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("%w: the environment has no %s", ErrNoTFConfig, EnvVar)
	}
	return ParseTFConfig([]byte(v))
}

// ParseTFConfig parses a TF_CONFIG document as TensorFlow does and validates
// it as tf.distribute's strategies do. On any problem it returns a
// *ValidationError that lists each one with its field, the value found and
// what was expected; it never panics, whatever data holds.
//
// Accepted, as in TensorFlow: a job as a list of addresses or as an object
// from task index ("0", "1", …) to address; "task.index" as a number or a
// decimal string; unknown keys, which are ignored (and listed in
// IgnoredKeys); "{}", which is a local program.
//
// Rejected, beyond JSON that is not an object: a job other than chief,
// worker, ps and evaluator; a job without tasks; an address that is not
// host:port; two tasks with one address; more than one chief or evaluator; a
// rpc_layer other than "grpc"; a non-empty cluster without a task; a task
// whose type or index the cluster does not have (an evaluator may be missing
// from the cluster, as TensorFlow allows).
func ParseTFConfig(data []byte) (*TFConfig, error) {
	const src = "TF_CONFIG"
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, invalid(src, []*FieldError{{Expected: "a JSON object such as " + exampleTFConfig}})
	}
	v, fe := decodeJSON(data)
	if fe != nil {
		return nil, invalid(src, []*FieldError{fe})
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, invalid(src, []*FieldError{{Value: render(v), Expected: "a JSON object such as " + exampleTFConfig}})
	}

	cfg := &TFConfig{}
	var probs []*FieldError
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		switch k {
		case "cluster", "task", "rpc_layer", "environment", "session_master":
		default:
			cfg.IgnoredKeys = append(cfg.IgnoredKeys, k)
		}
	}

	// A job whose JSON is broken is reported once, where it breaks, and
	// left out of the checks that would only repeat the problem.
	var jobs map[TaskType]map[int]string
	var broken map[TaskType]bool
	clusterBroken := false
	if cv := obj["cluster"]; cv != nil {
		var ps []*FieldError
		jobs, broken, ps = parseJobs("cluster", cv)
		clusterBroken = jobs == nil
		probs = append(probs, ps...)
		sound := maps.Clone(jobs)
		maps.DeleteFunc(sound, func(j TaskType, _ map[int]string) bool { return broken[j] })
		if ps = validateJobs("cluster", sound); len(ps) == 0 && len(jobs) > 0 {
			cfg.Cluster = ClusterSpec{jobs: jobs}
		} else {
			probs = append(probs, ps...)
		}
	}

	taskGiven := obj["task"] != nil
	taskOK := false
	if taskGiven {
		t, ignored, ps := parseTask(obj["task"])
		probs = append(probs, ps...)
		cfg.IgnoredKeys = append(cfg.IgnoredKeys, ignored...)
		cfg.Task, taskOK = t, len(ps) == 0
	}

	cfg.RPCLayer = parseString(obj, "rpc_layer", &probs)
	cfg.Environment = parseString(obj, "environment", &probs)
	cfg.SessionMaster = parseString(obj, "session_master", &probs)
	if cfg.RPCLayer != "" && cfg.RPCLayer != RPCLayerGRPC {
		probs = append(probs, rpcLayerProblem(cfg.RPCLayer))
	}

	switch {
	case clusterBroken:
	case taskOK && !broken[cfg.Task.Type]:
		probs = append(probs, checkTask(jobs, cfg.Task)...)
	case !taskGiven && len(jobs) > 0:
		probs = append(probs, &FieldError{Field: "task",
			Expected: fmt.Sprintf(`{"type": …, "index": …} naming this process's task in the cluster (one of %s)`,
				describeTasks(jobs))})
	}
	if err := invalid(src, probs); err != nil {
		return nil, err
	}
	slices.Sort(cfg.IgnoredKeys)
	return cfg, nil
}

// Validate checks a TFConfig built by hand (ParseTFConfig's results are
// valid): the rpc layer, and that the task is part of the cluster.
func (c *TFConfig) Validate() error {
	var probs []*FieldError
	if c.RPCLayer != "" && c.RPCLayer != RPCLayerGRPC {
		probs = append(probs, rpcLayerProblem(c.RPCLayer))
	}
	switch {
	case c.Task.Type == "" && !c.Cluster.IsEmpty():
		probs = append(probs, &FieldError{Field: "task",
			Expected: fmt.Sprintf(`a task of the cluster (one of %s)`, describeTasks(c.Cluster.jobs))})
	case c.Task.Type != "":
		if c.Task.Index < 0 {
			probs = append(probs, &FieldError{Field: "task.index", Value: strconv.Itoa(c.Task.Index),
				Expected: "an integer >= 0"})
		} else {
			probs = append(probs, checkTask(c.Cluster.jobs, c.Task)...)
		}
	}
	return invalid("TF_CONFIG", probs)
}

// IsLocal reports whether the config describes a local program without a
// cluster (no TF_CONFIG, "{}", or a task without a cluster).
func (c *TFConfig) IsLocal() bool { return c.Cluster.IsEmpty() }

// IsChief reports whether this process's task is the chief, as
// ClusterSpec.IsChief decides it; a local program is its own chief.
func (c *TFConfig) IsChief() bool { return c.Cluster.IsChief(c.Task) }

// MarshalJSON writes the config as TF_CONFIG JSON, fields in the order
// cluster, task, rpc_layer, environment, session_master; empty ones are left
// out. It returns a *ValidationError for a config that Validate rejects, so
// that nothing writes a TF_CONFIG TensorFlow would refuse.
func (c TFConfig) MarshalJSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteByte('{')
	sep := func() {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
	}
	if !c.Cluster.IsEmpty() {
		spec, _ := c.Cluster.MarshalJSON()
		b.WriteString(`"cluster":`)
		b.Write(spec)
	}
	if c.Task.Type != "" {
		sep()
		fmt.Fprintf(&b, `"task":{"type":%s,"index":%d}`, strconv.Quote(string(c.Task.Type)), c.Task.Index)
	}
	for _, f := range []struct{ key, val string }{
		{"rpc_layer", c.RPCLayer}, {"environment", c.Environment}, {"session_master", c.SessionMaster},
	} {
		if f.val != "" {
			sep()
			fmt.Fprintf(&b, `%q:%s`, f.key, strconv.Quote(f.val))
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON parses TF_CONFIG JSON as ParseTFConfig does.
func (c *TFConfig) UnmarshalJSON(data []byte) error {
	p, err := ParseTFConfig(data)
	if err != nil {
		return err
	}
	*c = *p
	return nil
}

// Marshal returns the TF_CONFIG of task in spec, ready to put in a process's
// environment, or a *ValidationError when task is not part of spec.
func Marshal(spec ClusterSpec, task Task) (string, error) {
	b, err := TFConfig{Cluster: spec, Task: task}.MarshalJSON()
	return string(b), err
}

const exampleTFConfig = `{"cluster": {"worker": ["host:port", …]}, "task": {"type": "worker", "index": 0}}`

// decodeJSON decodes one JSON value, numbers kept as json.Number, and
// nothing after it.
func decodeJSON(data []byte) (any, *FieldError) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, syntaxProblem(data, err, dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		off := dec.InputOffset()
		return nil, &FieldError{Value: near(data, off),
			Expected: fmt.Sprintf("one JSON value and nothing after it (more data at byte %d)", off)}
	}
	return v, nil
}

func syntaxProblem(data []byte, err error, off int64) *FieldError {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off = se.Offset
	}
	msg := err.Error()
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		msg = "the JSON ends too early"
		off = int64(len(data))
	}
	return &FieldError{Value: near(data, off), Err: err,
		Expected: fmt.Sprintf("valid JSON (%s, at byte %d)", msg, off)}
}

// near quotes the part of data around offset off.
func near(data []byte, off int64) string {
	const span = 24
	lo := max(off-span, 0)
	hi := min(off+span, int64(len(data)))
	lo = min(lo, hi)
	s := string(data[lo:hi])
	if lo > 0 {
		s = "…" + s
	}
	if hi < int64(len(data)) {
		s += "…"
	}
	if strings.ContainsRune(s, '`') || !strconv.CanBackquote(s) {
		return strconv.Quote(s)
	}
	return "`" + s + "`"
}

// parseJobs reads the "cluster" object structurally: each job a list of
// address strings or an object from index to address string.
func parseJobs(field string, v any) (jobs map[TaskType]map[int]string, broken map[TaskType]bool, probs []*FieldError) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, nil, []*FieldError{{Field: field, Value: render(v),
			Expected: `an object from job name to task addresses, e.g. {"worker": ["host:port", …]}`}}
	}
	jobs = map[TaskType]map[int]string{}
	broken = map[TaskType]bool{}
	for _, name := range sortedJobs(keysAsJobs(obj)) {
		jf := field + "." + string(name)
		tasks := map[int]string{}
		before := len(probs)
		switch t := obj[string(name)].(type) {
		case []any:
			for i, a := range t {
				s, ok := a.(string)
				if !ok {
					probs = append(probs, &FieldError{Field: fmt.Sprintf("%s[%d]", jf, i), Value: render(a),
						Expected: `a "host:port" string`})
					continue
				}
				tasks[i] = s
			}
		case map[string]any:
			keyOf := map[int]string{}
			for _, k := range slices.Sorted(maps.Keys(t)) {
				i, err := strconv.Atoi(strings.TrimSpace(k))
				if err != nil || i < 0 || i > maxIndex {
					probs = append(probs, &FieldError{Field: jf, Value: "key " + quote(k),
						Expected: fmt.Sprintf("task indices (integers in 0..%d) as keys", maxIndex)})
					continue
				}
				if prev, dup := keyOf[i]; dup {
					probs = append(probs, &FieldError{Field: jf, Value: "key " + quote(k),
						Expected: fmt.Sprintf("each task index once (key %s is index %d too)", quote(prev), i)})
					continue
				}
				keyOf[i] = k
				s, ok := t[k].(string)
				if !ok {
					probs = append(probs, &FieldError{Field: fmt.Sprintf("%s[%d]", jf, i), Value: render(t[k]),
						Expected: `a "host:port" string`})
					continue
				}
				tasks[i] = s
			}
		default:
			probs = append(probs, &FieldError{Field: jf, Value: render(t),
				Expected: `a list of "host:port" strings, or an object from task index to "host:port"`})
		}
		jobs[name] = tasks
		broken[name] = len(probs) > before
	}
	return jobs, broken, probs
}

func keysAsJobs(obj map[string]any) map[TaskType]struct{} {
	out := make(map[TaskType]struct{}, len(obj))
	for k := range obj {
		out[TaskType(k)] = struct{}{}
	}
	return out
}

// parseTask reads the "task" object structurally.
func parseTask(v any) (Task, []string, []*FieldError) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Task{}, nil, []*FieldError{{Field: "task", Value: render(v),
			Expected: `an object such as {"type": "worker", "index": 0}`}}
	}
	var t Task
	var ignored []string
	var probs []*FieldError
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if k != "type" && k != "index" {
			ignored = append(ignored, "task."+k)
		}
	}
	switch tv := obj["type"].(type) {
	case nil:
		probs = append(probs, &FieldError{Field: "task.type", Expected: `one of "chief", "worker", "ps", "evaluator"`})
	case string:
		t.Type = TaskType(tv)
		if !t.Type.Valid() {
			probs = append(probs, &FieldError{Field: "task.type", Value: quote(tv),
				Expected: `one of "chief", "worker", "ps", "evaluator"`})
		}
	default:
		probs = append(probs, &FieldError{Field: "task.type", Value: render(tv),
			Expected: `a string: "chief", "worker", "ps" or "evaluator"`})
	}
	idx, fe := parseIndex(obj["index"])
	if fe != nil {
		probs = append(probs, fe)
	}
	t.Index = idx
	return t, ignored, probs
}

// parseIndex reads "task.index": an integral JSON number or, as Python's
// int() accepts, a decimal string.
func parseIndex(v any) (int, *FieldError) {
	const want = "a task index: an integer >= 0"
	var f float64
	switch iv := v.(type) {
	case nil:
		return 0, &FieldError{Field: "task.index", Expected: want}
	case json.Number:
		if i, err := strconv.Atoi(iv.String()); err == nil {
			if i < 0 {
				return 0, &FieldError{Field: "task.index", Value: iv.String(), Expected: want}
			}
			if i > maxIndex {
				return 0, &FieldError{Field: "task.index", Value: iv.String(), Expected: fmt.Sprintf("an integer in 0..%d", maxIndex)}
			}
			return i, nil
		}
		var err error
		f, err = iv.Float64()
		if err != nil || f != math.Trunc(f) {
			return 0, &FieldError{Field: "task.index", Value: iv.String(), Expected: want}
		}
	case string:
		i, err := strconv.Atoi(strings.TrimSpace(iv))
		if err != nil {
			return 0, &FieldError{Field: "task.index", Value: quote(iv), Expected: want}
		}
		f = float64(i)
	default:
		return 0, &FieldError{Field: "task.index", Value: render(iv), Expected: want}
	}
	if f < 0 {
		return 0, &FieldError{Field: "task.index", Value: render(v), Expected: want}
	}
	if f > maxIndex {
		return 0, &FieldError{Field: "task.index", Value: render(v), Expected: fmt.Sprintf("an integer in 0..%d", maxIndex)}
	}
	return int(f), nil
}

// checkTask checks that t is a task of jobs (an evaluator may be missing;
// with no jobs at all only index 0 makes sense).
func checkTask(jobs map[TaskType]map[int]string, t Task) []*FieldError {
	if len(jobs) == 0 {
		if t.Index != 0 {
			return []*FieldError{{Field: "task.index", Value: strconv.Itoa(t.Index),
				Expected: "0: without a cluster the program is a local single task"}}
		}
		return nil
	}
	tasks, ok := jobs[t.Type]
	if !ok {
		if t.Type == Evaluator {
			if t.Index != 0 {
				return []*FieldError{{Field: "task.index", Value: strconv.Itoa(t.Index),
					Expected: "0: there is at most one evaluator"}}
			}
			return nil
		}
		return []*FieldError{{Field: "task.type", Value: quote(string(t.Type)),
			Expected: fmt.Sprintf("a job of the cluster (%s)", quoteJobs(sortedJobs(jobs)))}}
	}
	if _, ok := tasks[t.Index]; !ok && len(tasks) > 0 {
		return []*FieldError{{Field: "task.index", Value: strconv.Itoa(t.Index),
			Expected: fmt.Sprintf("%s (the %s job has %d task%s)",
				describeIndices(slices.Sorted(maps.Keys(tasks))), t.Type, len(tasks), plural(len(tasks)))}}
	}
	return nil
}

func rpcLayerProblem(v string) *FieldError {
	return &FieldError{Field: "rpc_layer", Value: quote(v),
		Expected: `"grpc" (or no rpc_layer): tfdist's TensorFlow runtime serves gRPC only`}
}

func parseString(obj map[string]any, key string, probs *[]*FieldError) string {
	switch v := obj[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		*probs = append(*probs, &FieldError{Field: key, Value: render(v), Expected: "a string"})
		return ""
	}
}

// describeTasks lists the tasks of jobs briefly, e.g. "chief:0, worker:0..1".
func describeTasks(jobs map[TaskType]map[int]string) string {
	var parts []string
	for _, job := range sortedJobs(jobs) {
		idx := slices.Sorted(maps.Keys(jobs[job]))
		switch {
		case len(idx) == 0:
		case len(idx) == 1:
			parts = append(parts, fmt.Sprintf("%s:%d", job, idx[0]))
		case idx[len(idx)-1] == len(idx)-1:
			parts = append(parts, fmt.Sprintf("%s:0..%d", job, len(idx)-1))
		default:
			parts = append(parts, fmt.Sprintf("%s:%v", job, idx))
		}
	}
	return strings.Join(parts, ", ")
}

// render writes a decoded JSON value back as JSON, shortened to a readable
// length.
func render(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return shorten(string(b))
}

// quote writes s as a JSON-style quoted string, shortened.
func quote(s string) string { return shorten(strconv.Quote(s)) }

func shorten(s string) string {
	const limit = 72
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
