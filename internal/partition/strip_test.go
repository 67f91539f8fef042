package partition_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	"google.golang.org/protobuf/proto"
)

// stripDevices returns a serialized GraphDef without devices.
func stripDevices(t *testing.T, b []byte) []byte {
	def := &graphpb.GraphDef{}
	require.NoError(t, proto.Unmarshal(b, def))
	for _, n := range def.Node {
		n.Device = ""
		delete(n.Attr, "_class")
	}
	out, err := proto.Marshal(def)
	require.NoError(t, err)
	return out
}
