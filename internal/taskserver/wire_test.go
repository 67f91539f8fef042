package taskserver

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/tfrt"
)

func decoderOf(e *encoder) *decoder {
	return newDecoder(bytes.NewReader(e.buf.Bytes()), int64(e.buf.Len()))
}

// crossed returns err as a client rebuilds it from the server's response.
func crossed(t *testing.T, err error) error {
	e := &encoder{}
	e.wireError(toWire(err))
	d := decoderOf(e)
	defer d.release()
	w := d.wireError()
	require.NoError(t, d.end())
	return w.rebuild("10.0.0.1:2222")
}

// An error crosses the wire as what it is: a TensorFlow error with its
// code, op and message; the sentinels; a refusal with its reason; and the
// task of a plan's run that failed around any of them.
func TestErrorsCrossTheWire(t *testing.T) {
	te := &tfrt.Error{Code: tfrt.InvalidArgument, Op: "run", Msg: "indices[2] = 99 is not in [0, 10)"}
	err := crossed(t, fmt.Errorf("taskserver: run %q: %w", "p", te))
	var got *tfrt.Error
	require.ErrorAs(t, err, &got)
	assert.Equal(t, te, got)
	assert.ErrorIs(t, err, tfrt.ErrInvalidArgument)
	assert.EqualError(t, err, `taskserver: run "p": run: INVALID_ARGUMENT: indices[2] = 99 is not in [0, 10)`)

	for _, sentinel := range []error{ErrUnknown, ErrUnavailable, ErrRestarted} {
		err := crossed(t, &partition.RunError{Task: "/job:ps/replica:0/task:1", Round: 2, Err: fmt.Errorf("on ps: %w", sentinel)})
		assert.ErrorIs(t, err, sentinel)
		var re *partition.RunError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, partition.RunError{Task: "/job:ps/replica:0/task:1", Round: 2, Err: re.Err}, *re)
		assert.EqualError(t, re.Err, "on ps: "+sentinel.Error())
	}

	err = crossed(t, &partition.RunError{Task: "/job:ps/replica:0/task:0", Err: &RefusedError{Addr: "10.0.0.2:2222", Reason: "no"}})
	var ref *RefusedError
	require.ErrorAs(t, err, &ref)
	assert.Equal(t, RefusedError{Addr: "10.0.0.2:2222", Reason: "no"}, *ref)

	err = crossed(t, errors.New("something else"))
	assert.EqualError(t, err, "something else")
	assert.False(t, errors.Is(err, ErrUnknown) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRestarted))
}

// A handle is refused on both ends of the wire, naming the tensor and
// its dtype.
func TestHandlesDoNotCross(t *testing.T) {
	s := op.NewScope()
	h := op.VarHandleOp(s, tf.Float, tf.ScalarShape())
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, []tf.Output{h}, nil)
	require.NoError(t, err)
	assert.EqualError(t, (&encoder{}).tensor("v:0", out[0]),
		`taskserver: tensor "v:0": dtype resource cannot cross tasks (a handle means something only on its own task)`)

	e := &encoder{}
	e.string("v:0")
	e.uvarint(uint64(out[0].DataType()))
	e.uvarint(0)
	d := decoderOf(e)
	defer d.release()
	d.tensor()
	assert.EqualError(t, d.end(), `taskserver: tensor "v:0": dtype resource cannot cross tasks (a handle means something only on its own task)`)
}

// A body that lies about its contents is an error naming what is wrong,
// before anything is allocated for it.
func TestMalformedTensors(t *testing.T) {
	cases := map[string]func(e *encoder){
		"contents of another size": func(e *encoder) {
			e.string("x:0")
			e.uvarint(uint64(tf.Float))
			e.uvarint(1)
			e.uvarint(3)
			e.uvarint(8)
			e.buf.Write(make([]byte, 8))
		},
		"more strings than bytes": func(e *encoder) {
			e.string("s:0")
			e.uvarint(uint64(tf.String))
			e.uvarint(1)
			e.uvarint(1 << 40)
		},
		"a huge length": func(e *encoder) { e.uvarint(1 << 50) },
		"an overflowing shape": func(e *encoder) {
			e.string("x:0")
			e.uvarint(uint64(tf.Float))
			e.uvarint(2)
			e.uvarint(1 << 62)
			e.uvarint(1 << 62)
		},
	}
	for name, write := range cases {
		e := &encoder{}
		write(e)
		d := decoderOf(e)
		d.tensor()
		err := d.end()
		d.release()
		assert.ErrorContains(t, err, "malformed body", name)
	}
}

// The timeout a call sends is never shorter than the time its caller
// still waits, so the server never gives up on a request before its
// caller does.
func TestTimeoutHeaderIsNeverShorterThanTheCallersWait(t *testing.T) {
	for _, c := range []struct {
		wait time.Duration
		want int64
	}{
		{1900 * time.Microsecond, 2}, {2 * time.Millisecond, 2}, {2*time.Millisecond + time.Nanosecond, 3},
		{time.Nanosecond, 1}, {0, 1}, {-time.Second, 1}, {1999999 * time.Microsecond, 2000},
	} {
		assert.Equal(t, c.want, timeoutMillis(c.wait), "%v", c.wait)
	}
}
