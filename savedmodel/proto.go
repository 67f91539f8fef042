package savedmodel

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	nodepb "github.com/wamuir/graft/tensorflow/core/framework/node_def_go_proto"
	shapepb "github.com/wamuir/graft/tensorflow/core/framework/tensor_shape_go_proto"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"
	corepb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"google.golang.org/protobuf/proto"
)

// predictMethod is the method of every signature Export writes: a map of
// named tensors to a map of named tensors, TensorFlow Serving's Predict.
const predictMethod = "tensorflow/serving/predict"

// savedModel returns saved_model.pb: one MetaGraphDef tagged serve, with
// the graph, the saver and the signatures.
func (g *graph) savedModel() ([]byte, error) {
	mg := &corepb.MetaGraphDef{
		MetaInfoDef: &corepb.MetaGraphDef_MetaInfoDef{
			Tags:              []string{ServeTag},
			TensorflowVersion: tf.Version(),
		},
		GraphDef:     g.def,
		SignatureDef: map[string]*corepb.SignatureDef{},
	}
	if g.saver != nil {
		mg.SaverDef = g.saver.def
	}
	for _, s := range g.sigs {
		sd := &corepb.SignatureDef{Inputs: map[string]*corepb.TensorInfo{}, Outputs: map[string]*corepb.TensorInfo{}}
		//lint:ignore SA1019 TensorFlow Serving before 2.4 checks the method, and TensorFlow 2 still writes it
		sd.MethodName = predictMethod
		for name, o := range s.inputs {
			sd.Inputs[name] = tensorInfo(o)
		}
		for name, o := range s.outputs {
			sd.Outputs[name] = tensorInfo(o)
		}
		mg.SignatureDef[s.name] = sd
	}
	return proto.Marshal(&corepb.SavedModel{SavedModelSchemaVersion: 1, MetaGraphs: []*corepb.MetaGraphDef{mg}})
}

func tensorInfo(o tf.Output) *corepb.TensorInfo {
	return &corepb.TensorInfo{
		Encoding:    &corepb.TensorInfo_Name{Name: tensorName(o)},
		Dtype:       typespb.DataType(o.DataType()),
		TensorShape: shapeProto(o.Shape()),
	}
}

func shapeProto(s tf.Shape) *shapepb.TensorShapeProto {
	n := s.NumDimensions()
	if n < 0 {
		return &shapepb.TensorShapeProto{UnknownRank: true}
	}
	p := &shapepb.TensorShapeProto{Dim: make([]*shapepb.TensorShapeProto_Dim, n)}
	for i := range n {
		p.Dim[i] = &shapepb.TensorShapeProto_Dim{Size: s.Size(i)}
	}
	return p
}

// checkInputs checks that every output of every signature depends on no
// placeholder but the signature's own inputs: a server feeds only those.
func (g *graph) checkInputs() error {
	nodes := make(map[string]*nodepb.NodeDef, len(g.def.Node))
	for _, n := range g.def.Node {
		nodes[n.Name] = n
	}
	for _, s := range g.sigs {
		own := map[string]bool{}
		for _, in := range s.inputs {
			own[in.Op.Name()] = true
		}
		for _, name := range sortedKeys(s.outputs) {
			if ph := foreignPlaceholder(nodes, s.outputs[name].Op.Name(), own); ph != "" {
				return fmt.Errorf("savedmodel: signature %q: output %q depends on placeholder %q, which is not an input of the signature (its inputs: %s); a signature's outputs may use only its own inputs",
					s.name, name, ph, strings.Join(sortedKeys(s.inputs), ", "))
			}
		}
	}
	return nil
}

// foreignPlaceholder returns a Placeholder that the node from depends on
// and that own does not hold, "" when there is none.
func foreignPlaceholder(nodes map[string]*nodepb.NodeDef, from string, own map[string]bool) string {
	seen := map[string]bool{from: true}
	stack := []string{from}
	for len(stack) > 0 {
		n := nodes[stack[len(stack)-1]]
		stack = stack[:len(stack)-1]
		if n == nil {
			continue
		}
		if n.Op == "Placeholder" && !own[n.Name] {
			return n.Name
		}
		for _, in := range n.Input {
			if name := nodeName(in); !seen[name] {
				seen[name] = true
				stack = append(stack, name)
			}
		}
	}
	return ""
}
