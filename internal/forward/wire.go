package forward

import (
	"errors"
	"fmt"
	"time"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
)

// Path is where a replica takes evidence its peers forward.
const Path = "/v1/peer/reports"

// MaxBodyBytes bounds the body of one forwarded request, sender and
// receiver alike: a batch of MaxBatch items with an actor each fits with
// room to spare, and a sender splits anything larger.
const MaxBodyBytes = 8 << 20

// Body is the body of POST /v1/peer/reports: batches of evidence, each
// accepted from one actor by the replica that sends them.
type Body struct {
	Batches []Batch `json:"batches"`
}

// Batch is evidence accepted from one actor.
type Batch struct {
	Actor   Actor              `json:"actor"`
	Reports []evaluator.Report `json:"reports"`
}

// Result is a peer's answer: how many items it applied, how many it
// refused (its own registry copy may not know an instance yet, say), and
// which and why. Refusals is new: a sender of the release before ignores
// the answer's body, and one that meets a receiver of that release (no
// Refusals) counts its refusals under the reason "unreported".
type Result struct {
	Accepted int       `json:"accepted"`
	Refused  int       `json:"refused"`
	Refusals []Refusal `json:"refusals,omitempty"`
}

// Refusal is one refused item of a forwarded body: its index among all
// the body's reports (batch after batch, in order) and the evaluator's
// refusal code (evaluator.Refusal).
type Refusal struct {
	Index int    `json:"index"`
	Code  string `json:"code"`
}

// ToLocalClock moves the times of reports a peer forwarded from its
// clock onto this replica's. signedAt is the peer's clock when it signed
// the request (peer.SignedAt) and now this replica's on receiving it, so
// now-signedAt is how far the peer's clock is behind this one, transit
// included (at most a few milliseconds, which only ages an item). Every
// item then says when it reached muster on the clock that judges it:
// without this a peer whose clock is ahead forwards "future" evidence,
// refused, and one whose clock is behind forwards evidence that looks
// older than it is. Reports without a time are left without one (the
// receiver stamps them with its now).
func ToLocalClock(reports []evaluator.Report, signedAt, now time.Time) {
	offset := now.Sub(signedAt)
	// New times, not the old ones changed in place (a caller's reports
	// may share them), in one allocation for the batch.
	var ats []time.Time
	for i := range reports {
		if reports[i].At != nil {
			if ats == nil {
				ats = make([]time.Time, 0, len(reports)-i)
			}
			ats = append(ats, reports[i].At.Add(offset))
			reports[i].At = &ats[len(ats)-1]
		}
	}
}

// Actor is the wire form of the identity.Principal the sending replica
// authenticated: who it is, not how it proved it. No token, no expiry,
// and no vouched-for addresses travel (the address proof was made by the
// sender; evaluator.IngestForwarded does not repeat it).
type Actor struct {
	Issuer string `json:"issuer,omitempty"`
	// Home: Issuer is the region's home issuer (replicas of a region
	// share their issuer configuration).
	Home    bool   `json:"home,omitempty"`
	Subject string `json:"subject"`
	Kind    string `json:"kind"`
	Service string `json:"service,omitempty"`
	Team    string `json:"team,omitempty"`
	Role    string `json:"role,omitempty"`
	// Pod and Cluster bind a workload to one pod's instance (Principal).
	Pod     string `json:"pod,omitempty"`
	Cluster string `json:"cluster,omitempty"`
}

// ActorOf is p's wire form.
func ActorOf(p identity.Principal) Actor {
	return Actor{Issuer: p.Issuer, Home: p.Home, Subject: p.Subject, Kind: string(p.Kind), Service: p.Service,
		Team: p.Team, Role: string(p.Role), Pod: p.Pod, Cluster: p.Cluster}
}

// maxField bounds each of an actor's strings (an issuer URL is the
// longest).
const maxField = 1024

// Principal is the principal a describes, checked as far as its wire form
// allows: a known kind, a subject, a service for a workload, a known role.
func (a Actor) Principal() (identity.Principal, error) {
	for name, v := range map[string]string{"issuer": a.Issuer, "subject": a.Subject, "service": a.Service, "team": a.Team, "pod": a.Pod, "cluster": a.Cluster} {
		if len(v) > maxField {
			return identity.Principal{}, fmt.Errorf("%s longer than %d bytes", name, maxField)
		}
	}
	kind, err := identity.ParseKind(a.Kind)
	if err != nil {
		return identity.Principal{}, err
	}
	if a.Subject == "" {
		return identity.Principal{}, errors.New("missing subject")
	}
	if kind == identity.KindWorkload && a.Service == "" {
		return identity.Principal{}, errors.New("a workload is bound to a service")
	}
	p := identity.Principal{Issuer: a.Issuer, Home: a.Home, Subject: a.Subject, Kind: kind, Service: a.Service,
		Team: a.Team, Pod: a.Pod, Cluster: a.Cluster}
	if a.Role != "" {
		if p.Role, err = identity.ParseRole(a.Role); err != nil {
			return identity.Principal{}, err
		}
	}
	return p, nil
}
