package train_test

import (
	"context"
	"encoding/csv"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/train"
)

// readCSV reads a CSV file separated by sep.
func readCSV(t *testing.T, path string, sep rune) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma = sep
	rows, err := r.ReadAll()
	require.NoError(t, err)
	return rows
}

// checkRow checks a row of the CSV against the History's values of its
// epoch, the i-th of the History and its v-th validation (-1: "NA").
func checkRow(t *testing.T, header, row []string, h *train.History, i, v int) {
	t.Helper()
	require.Equal(t, strconv.Itoa(h.Epochs[i]), row[0])
	for j, k := range header[1:] {
		switch {
		case k[:4] == "val_" && v < 0:
			assert.Equal(t, "NA", row[j+1], "epoch %d: %s", h.Epochs[i], k)
		case k[:4] == "val_":
			assert.Equal(t, strconv.FormatFloat(h.Values[k][v], 'g', -1, 64), row[j+1], "epoch %d: %s", h.Epochs[i], k)
		default:
			assert.Equal(t, strconv.FormatFloat(h.Values[k][i], 'g', -1, 64), row[j+1], "epoch %d: %s", h.Epochs[i], k)
		}
	}
}

// CSVLogger writes a header of "epoch" and the sorted keys and a row per
// epoch with History's values, "NA" at epochs that did not validate. The
// rows of the epochs that ended survive a Fit that fails, and a Fit with
// CSVAppend continues the file under the same header.
func TestCSVLoggerRowsPerEpoch(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	path := filepath.Join(t.TempDir(), "log.csv")
	failing := &train.LambdaCallback{EpochBegin: func(_ context.Context, _ *train.Run, epoch int) error {
		if epoch == 3 {
			return errors.New("crash")
		}
		return nil
	}}
	h, err := tr.Fit(ctx, ds, train.Epochs(6), train.ValidationData(val), train.ValidationFreq(2),
		train.WithCallbacks(train.NewCSVLogger(path, train.CSVSeparator(';')), failing))
	require.ErrorContains(t, err, "crash")
	require.Equal(t, []int{0, 1, 2}, h.Epochs)

	rows := readCSV(t, path, ';')
	header := []string{"epoch", "accuracy", "loss", "val_accuracy", "val_loss"}
	require.Len(t, rows, 4)
	require.Equal(t, header, rows[0])
	for i := range 3 {
		checkRow(t, header, rows[1+i], h, i, map[int]int{0: -1, 1: 0, 2: -1}[i])
	}

	h2, err := tr.Fit(ctx, ds, train.Epochs(5), train.InitialEpoch(3), train.ValidationData(val), train.ValidationFreq(2),
		train.WithCallbacks(train.NewCSVLogger(path, train.CSVSeparator(';'), train.CSVAppend())))
	require.NoError(t, err)
	appended := readCSV(t, path, ';')
	require.Len(t, appended, 6)
	assert.Equal(t, rows, appended[:4], "the earlier rows as they were")
	checkRow(t, header, appended[4], h2, 0, 0)
	checkRow(t, header, appended[5], h2, 1, -1)

	_, err = tr.Fit(ctx, ds, train.WithCallbacks(train.NewCSVLogger(path, train.CSVSeparator('"'))))
	require.ErrorContains(t, err, `callback CSVLogger: OnTrainBegin: CSVSeparator('"'), expected a character other than a quote, a line break or NUL`)
}
