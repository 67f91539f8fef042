package launch_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
	"github.com/tfdist/tfdist/internal/emunet"
)

// What a cluster on emulated hosts cannot do is refused, saying why.
func TestLinkBadOptions(t *testing.T) {
	for _, c := range []struct {
		opts []launch.Option
		want string
	}{
		{[]launch.Option{launch.WithLink(emunet.Link{}), launch.WithMetrics(true)}, "link: the tasks' metrics would be served inside their hosts"},
	} {
		_, err := launch.New([]string{"x"}, c.opts...)
		assert.ErrorContains(t, err, c.want)
	}
}
