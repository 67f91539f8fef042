package cluster

import (
	"fmt"
	"maps"
	"slices"

	pb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"google.golang.org/protobuf/proto"
)

// ClusterDef returns the spec as TensorFlow's ClusterDef protocol buffer,
// jobs in canonical order. The empty spec gives an empty ClusterDef.
func (c ClusterSpec) ClusterDef() *pb.ClusterDef {
	def := &pb.ClusterDef{}
	for _, job := range c.Jobs() {
		tasks := make(map[int32]string, len(c.jobs[job]))
		for _, i := range slices.Sorted(maps.Keys(c.jobs[job])) {
			tasks[int32(i)] = c.jobs[job][i]
		}
		def.Job = append(def.Job, &pb.JobDef{Name: string(job), Tasks: tasks})
	}
	return def
}

// ServerDef returns the ServerDef that starts the TensorFlow server of one
// task of the cluster over gRPC. config, which may be nil, becomes the
// server's default session config (logical CPU devices, thread pools, …);
// it is copied. A task that is not part of the cluster is an error
// wrapping ErrNoSuchTask.
func (c ClusterSpec) ServerDef(taskType TaskType, index int, config *pb.ConfigProto) (*pb.ServerDef, error) {
	if _, err := c.TaskAddress(taskType, index); err != nil {
		return nil, fmt.Errorf("server def: %w", err)
	}
	def := &pb.ServerDef{
		Cluster:   c.ClusterDef(),
		JobName:   string(taskType),
		TaskIndex: int32(index),
		Protocol:  RPCLayerGRPC,
	}
	if config != nil {
		def.DefaultSessionConfig = proto.Clone(config).(*pb.ConfigProto)
	}
	return def, nil
}
