// Package elastic decides the membership of an elastic job: which workers
// train together, in which order, from which step.
//
// A Server (the rendezvous, which `tfdist launch --elastic` runs) admits
// workers between a minimum and a maximum and forms numbered memberships,
// its epochs. A worker joins with Join and asks for each membership with
// Member.Next, reporting the last step it completed and the address its
// next collective group listens on. The server forms a new membership when
// a member dies (its connection breaks, or it misses its heartbeats), when
// every member of a broken group has reported, when a member leaves, or
// when a worker waits to join: then it tells the members (Member.Pending),
// which agree, through their group, on a step boundary at which all of
// them report (Agree).
//
// A membership names its members in rank order (survivors keep their
// relative order, joiners follow in the order of their names), the newest step
// any of them completed, and the member holding it (Holder), from which the
// others take the state. A joiner of another job, protocol or model is
// refused with the reason and the group goes on; a worker that keeps
// leaving is refused once it has left more than the flap limit allows; a
// job below its minimum waits for joiners up to its wait timeout, then
// stops with a *StopError naming who left and when.
package elastic
