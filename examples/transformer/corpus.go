package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// The vocabulary: one id per character of printable ASCII, tab and
// newline, and one for any other byte.
const (
	otherID   = 0 // any byte outside the vocabulary
	tabID     = 1
	newlineID = 2
	firstID   = 3 // ' ' (0x20) .. '~' (0x7e) are 3 .. 97
	vocabSize = firstID + '~' - ' ' + 1
)

// heldOutEvery holds out every heldOutEvery-th file of the corpus (in
// sorted order) from training.
const heldOutEvery = 10

// encode maps text to character ids.
func encode(text []byte) []int32 {
	ids := make([]int32, len(text))
	for i, c := range text {
		switch {
		case c == '\t':
			ids[i] = tabID
		case c == '\n':
			ids[i] = newlineID
		case c >= ' ' && c <= '~':
			ids[i] = firstID + int32(c-' ')
		default:
			ids[i] = otherID
		}
	}
	return ids
}

// decode maps character ids back to text, U+FFFD for the id of other
// bytes.
func decode(ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		switch {
		case id == tabID:
			sb.WriteByte('\t')
		case id == newlineID:
			sb.WriteByte('\n')
		case id >= firstID && id < vocabSize:
			sb.WriteByte(byte(' ' + id - firstID))
		default:
			sb.WriteRune('\uFFFD')
		}
	}
	return sb.String()
}

// corpus is the text the model learns from, as character ids: whole .go
// files, every heldOutEvery-th of them (sorted by path) held out.
type corpus struct {
	dir                   string
	train, eval           []int32
	trainFiles, evalFiles int // files read, the last of each set possibly cut short
}

// loadCorpus reads the .go files under dir, sorted by path: file i is
// held out when i%heldOutEvery == heldOutEvery-1, and trains otherwise.
// Each set takes whole files until it holds its cap of bytes, the last
// cut to fit. A directory without .go files, or one it cannot read, is an
// error naming it.
func loadCorpus(dir string, trainCap, evalCap int) (corpus, error) {
	c := corpus{dir: dir}
	paths, err := goFiles(dir)
	if err != nil {
		return c, err
	}
	if len(paths) < heldOutEvery {
		return c, fmt.Errorf("corpus %s: %d .go files, expected at least %d (every %dth file is held out)", dir, len(paths), heldOutEvery, heldOutEvery)
	}
	for i, p := range paths {
		set, limit, files := &c.train, trainCap, &c.trainFiles
		if i%heldOutEvery == heldOutEvery-1 {
			set, limit, files = &c.eval, evalCap, &c.evalFiles
		}
		if len(c.train) >= trainCap && len(c.eval) >= evalCap {
			break
		}
		if len(*set) >= limit {
			continue
		}
		text, err := os.ReadFile(p)
		if err != nil {
			return c, fmt.Errorf("corpus %s: %w", dir, err)
		}
		*set = append(*set, encode(text[:min(len(text), limit-len(*set))])...)
		*files++
	}
	if len(c.train) < 2 || len(c.eval) < 2 {
		return c, fmt.Errorf("corpus %s: %d training and %d held-out characters, expected at least 2 of each", dir, len(c.train), len(c.eval))
	}
	return c, nil
}

// goFiles returns the paths of the .go files under dir, sorted, skipping
// directories the go tool ignores (testdata, and names beginning with "."
// or "_").
func goFiles(dir string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != dir && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() && strings.HasSuffix(name, ".go") {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("corpus %s: %w", dir, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("corpus %s: no .go files", dir)
	}
	slices.Sort(paths)
	return paths, nil
}

// goSource returns the Go standard library's source directory,
// $(go env GOROOT)/src, of the go command on the PATH or else of the
// toolchain that built this program.
func goSource() (string, error) {
	root := ""
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		root = strings.TrimSpace(string(out))
	}
	if root == "" {
		root = runtime.GOROOT() //nolint:staticcheck // the fallback when no go command is on the PATH
	}
	if root == "" {
		return "", errors.New("corpus: no GOROOT: neither `go env GOROOT` nor the toolchain names one; give -corpus")
	}
	return filepath.Join(root, "src"), nil
}

// bigramStats describes the text as a bigram model sees it, in nats per
// character.
type bigramStats struct {
	// Entropy is H(next | previous), the conditional entropy of a
	// character given the one before it, estimated from the training
	// text's counts: the loss of the best bigram model on that text.
	Entropy float64
	// HeldOut is the cross-entropy on the held-out text of the bigram
	// model of the training counts, add-alpha smoothed.
	HeldOut float64
	// Unigram is H(next), the entropy of the training text's characters.
	Unigram float64
}

// bigramAlpha is the additive smoothing of the held-out bigram model
// (Krichevsky–Trofimov's 1/2).
const bigramAlpha = 0.5

// bigram returns the bigram statistics of train and eval.
func bigram(train, eval []int32) bigramStats {
	var pairs [vocabSize][vocabSize]float64
	var rows, chars [vocabSize]float64
	for i := 1; i < len(train); i++ {
		pairs[train[i-1]][train[i]]++
		rows[train[i-1]]++
		chars[train[i]]++
	}
	var st bigramStats
	n := float64(len(train) - 1)
	for a := range pairs {
		if chars[a] > 0 {
			st.Unigram -= chars[a] / n * math.Log(chars[a]/n)
		}
		for _, c := range pairs[a] {
			if c > 0 {
				st.Entropy -= c / n * math.Log(c/rows[a])
			}
		}
	}
	for i := 1; i < len(eval); i++ {
		a, b := eval[i-1], eval[i]
		st.HeldOut -= math.Log((pairs[a][b] + bigramAlpha) / (rows[a] + bigramAlpha*vocabSize))
	}
	st.HeldOut /= float64(len(eval) - 1)
	return st
}

// windows cuts ids into the examples of a language model of sequence
// length seqLen: x holds characters k·seqLen … k·seqLen+seqLen-1 and y the
// characters one later, so every character but the first is a target of
// exactly one example. The characters left over at the end, fewer than
// seqLen, are not used.
func windows(ids []int32, seqLen int) (x, y [][]int32) {
	n := (len(ids) - 1) / seqLen
	x, y = make([][]int32, n), make([][]int32, n)
	for k := range n {
		x[k] = ids[k*seqLen : (k+1)*seqLen]
		y[k] = ids[k*seqLen+1 : (k+1)*seqLen+1]
	}
	return x, y
}
