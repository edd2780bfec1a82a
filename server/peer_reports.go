package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/peer"
)

// Forwarder takes the evidence this replica accepted, to take it to the
// replicas that keep each service's evidence (forward.Forwarder):
// services[i] is reports[i]'s service. Offer must not block.
type Forwarder interface {
	Offer(actor identity.Principal, reports []evaluator.Report, services []string)
}

// PeerVerifier checks that a request comes from a replica of this region
// (peer.Verifier).
type PeerVerifier interface {
	Verify(r *http.Request, body []byte) (string, error)
}

type peerKey struct{}

// peerBodyKey holds the body authenticatePeer read and verified, so a
// handler that wants it whole need not copy it again.
type peerBodyKey struct{}

// peerBody is r's body: the one authenticatePeer verified, or read here
// (at most forward.MaxBodyBytes).
func peerBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if body, ok := r.Context().Value(peerBodyKey{}).([]byte); ok {
		return body, nil
	}
	return readBody(w, r, forward.MaxBodyBytes)
}

// readBody reads r's body of at most limit bytes, into a buffer sized
// by its Content-Length when it gives one (io.ReadAll would grow one
// from 512 bytes, copying a forwarded batch several times over).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength <= 0 || r.ContentLength > limit {
		return io.ReadAll(body)
	}
	// The server ends the body at its Content-Length.
	buf := make([]byte, r.ContentLength)
	n, err := io.ReadFull(body, buf)
	return buf[:n], err
}

// authenticatePeer admits only requests signed by a replica of this
// region with the region's key (internal/peer); a bearer token counts for
// nothing here. The body is read (bounded by forward.MaxBodyBytes) to check
// the signature over it, and handed on. Refusals are answered and counted
// as authenticate's are, per source address.
func (s *Server) authenticatePeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := addressKey(sourceAddr(r))
		if d := s.limits.unauthenticated.Peek(addr); !d.Allowed {
			s.metrics.unauthenticated.WithLabelValues("429").Inc()
			s.refuseLimited(w, r, d, "unauthenticated", fmt.Sprintf(
				"%d requests from %s were refused for want of a valid token or replica signature within %s, the most allowed; this one was not looked at: retry in %d s",
				d.Limit.Max, addr, d.Limit.Window, d.ResetSeconds()))
			return
		}
		var (
			id   string
			body []byte
			err  = fmt.Errorf("%w: this replica has no signing key, so it takes nothing from peers", peer.ErrNotPeer)
		)
		switch {
		case !peer.Signed(r):
			// Not worth reading the body of (the verifier counts it).
			err = fmt.Errorf("%w: no %s header", peer.ErrNotPeer, peer.Header)
			if s.cfg.Peers != nil {
				_, err = s.cfg.Peers.Verify(r, nil)
			}
		case s.cfg.Peers != nil:
			body, err = readBody(w, r, forward.MaxBodyBytes)
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				writeProblem(w, r, problem(http.StatusRequestEntityTooLarge, "body-too-large",
					fmt.Sprintf("the body is larger than the %d-byte limit", int64(forward.MaxBodyBytes))))
				return
			}
			if err == nil {
				id, err = s.cfg.Peers.Verify(r, body)
			}
		}
		if err != nil {
			if !errors.Is(err, peer.ErrNotPeer) {
				// The body could not be read: the client went away.
				writeProblem(w, r, problem(http.StatusBadRequest, "malformed-json", "the body could not be read: "+err.Error()))
				return
			}
			const reason = "not_peer"
			s.metrics.authFailures.WithLabelValues(reason).Inc()
			s.auditAuthFailure(addr, reason)
			s.metrics.unauthenticated.WithLabelValues("401").Inc()
			s.limits.unauthenticated.Charge(addr, 1)
			writeProblem(w, r, problem(http.StatusUnauthorized, "unauthenticated",
				"this call is for replicas of this region, signed with its key: "+err.Error()))
			return
		}
		if ann, ok := r.Context().Value(annotationKey{}).(*annotation); ok {
			ann.principal = "replica:" + id
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		ctx := context.WithValue(context.WithValue(r.Context(), peerKey{}, id), peerBodyKey{}, body)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// peerBatch is one decoded, checked batch of a forwarded body.
type peerBatch struct {
	actor   identity.Principal
	reports []evaluator.Report
}

// decodePeerReports reads and checks a POST /v1/peer/reports body: the
// compact form (forward.BinaryContentType; 400 when it cannot be read
// whole), or JSON as decodePeer takes it (400, 413, 415; members it does
// not know are ignored, the first of them returned), then 1 to evaluator.MaxBatch
// items in all, none of its batches empty, every actor a principal (422).
// A body refused is refused whole: nothing of it is applied.
func decodePeerReports(w http.ResponseWriter, r *http.Request) ([]peerBatch, string, *Problem) {
	var (
		b       forward.Body
		unknown string
		p       *Problem
	)
	if mediaType(r) == forward.BinaryContentType {
		// The compact form every replica of this release sends.
		body, err := peerBody(w, r)
		if err == nil {
			b.Batches, err = forward.DecodeBinary(body, evaluator.MaxBatch)
		}
		if err != nil {
			return nil, "", problem(http.StatusBadRequest, "malformed-evidence", "the compact evidence body could not be read: "+err.Error())
		}
	} else if b, unknown, p = decodePeer[forward.Body](w, r, forward.MaxBodyBytes); p != nil {
		return nil, "", p
	}
	p = problem(http.StatusUnprocessableEntity, "validation", "the forwarded evidence is not valid")
	out := make([]peerBatch, 0, len(b.Batches))
	total := 0
	for i, g := range b.Batches {
		actor, err := g.Actor.Principal()
		if err != nil {
			p.Errors = append(p.Errors, fieldError(fmt.Sprintf("batches/%d/actor", i), err.Error()))
		}
		if len(g.Reports) == 0 {
			p.Errors = append(p.Errors, fieldError(fmt.Sprintf("batches/%d/reports", i), "a batch holds at least one report"))
		}
		total += len(g.Reports)
		out = append(out, peerBatch{actor: actor, reports: g.Reports})
	}
	if total == 0 || total > evaluator.MaxBatch {
		p.Errors = append(p.Errors, fieldError("batches", fmt.Sprintf("a body holds 1 to %d reports in all, got %d", evaluator.MaxBatch, total)))
	}
	if len(p.Errors) > 0 {
		return nil, "", p
	}
	return out, unknown, nil
}

// peerReportsPost applies evidence another replica of the region
// accepted and forwarded (internal/forward): each batch as its actor's,
// already proven where only the receiving replica could prove it
// (evaluator.IngestForwarded). Nothing is forwarded again, and refusals
// are answered, not audited: the replica that received the evidence
// audited its own.
func (s *Server) peerReportsPost(w http.ResponseWriter, r *http.Request) {
	batches, unknown, p := decodePeerReports(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	s.peerUnknownField(r, unknown)
	// The items' times are the sender's clock: judge them on this one's
	// (authenticatePeer checked the signing time is within the window).
	now := s.cfg.Now()
	signed, ok := peer.SignedAt(r)
	if !ok {
		signed = now
	}
	res := forward.Result{Refusals: []forward.Refusal{}}
	base := 0
	for _, b := range batches {
		forward.ToLocalClock(b.reports, signed, now)
		got, err := s.cfg.Evaluator.IngestForwarded(r.Context(), b.actor, b.reports)
		if err != nil {
			// Not ready: only the first batch can meet it, so nothing
			// was applied.
			s.writeError(w, r, err)
			return
		}
		res.Accepted += got.Accepted
		res.Refused += len(got.Refused)
		// Which and why, so the sender retries what a retry may fix
		// and counts the rest by reason, never as delivered.
		for _, f := range got.Refused {
			res.Refusals = append(res.Refusals, forward.Refusal{Index: base + f.Index, Code: f.Code})
		}
		base += len(b.reports)
	}
	writeJSON(w, http.StatusOK, res)
}

// accepted returns the reports of a batch that res did not refuse, and
// their services (nil when res names none).
func accepted(reports []evaluator.Report, res evaluator.Result) ([]evaluator.Report, []string) {
	if len(res.Refused) == 0 {
		return reports, res.Services
	}
	refused := make(map[int]bool, len(res.Refused))
	for _, r := range res.Refused {
		refused[r.Index] = true
	}
	out := make([]evaluator.Report, 0, res.Accepted)
	var services []string
	if len(res.Services) == len(reports) {
		services = make([]string, 0, res.Accepted)
	}
	for i, r := range reports {
		if !refused[i] {
			out = append(out, r)
			if services != nil {
				services = append(services, res.Services[i])
			}
		}
	}
	return out, services
}

// decodePeer reads a replica-to-replica JSON body of at most limit bytes
// into a new T, refusing it whole as decodeStrict does (415, 413, 400 for
// malformed JSON, a wrong type or value, trailing data) except for one
// thing: members T does not know are ignored, and the first of them is
// returned (a JSON pointer, "" when there is none). During a rolling
// upgrade the replicas of a region run two releases; a newer one may
// add a member to what it sends, and refusing the body for it would drop
// evidence an older replica can use in full. The public API stays strict
// (a client's typo must not pass unnoticed); between replicas, a sender
// signed with the region's key adds members only under the rule in
// docs/replicas.md ("Rolling upgrade": a member added must be safe to
// ignore). The body is decoded strictly first, and again leniently only
// when that met a member it does not know: the common case costs nothing
// more, and the second pass runs only while releases are mixed.
func decodePeer[T any](w http.ResponseWriter, r *http.Request, limit int64) (v T, unknown string, p *Problem) {
	if p := jsonContentType(r); p != nil {
		return v, "", p
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		err = jsonv2.Unmarshal(body, &v, jsonv2.RejectUnknownMembers(true))
		var sem *jsonv2.SemanticError
		if errors.As(err, &sem) && errors.Is(err, jsonv2.ErrUnknownName) {
			unknown = string(sem.JSONPointer)
			var fresh T // the strict pass may have filled part of v
			v = fresh
			err = jsonv2.Unmarshal(body, &v)
		}
	}
	if err != nil {
		var zero T
		return zero, "", decodeProblemV2(err, limit)
	}
	return v, unknown, nil
}

// maxUnknownFieldsLogged bounds the distinct unknown members logged, so
// that a peer sending a new member per request cannot fill the log.
const maxUnknownFieldsLogged = 64

// unknownFields remembers the unknown members of peer requests already
// logged, by route and member (array indexes left out).
type unknownFields struct {
	mu   sync.Mutex
	seen map[string]bool
}

// peerUnknownField counts a peer request that carried a member this
// release does not know (pointer, "" for none) and logs the first of
// each kind: a rolling upgrade is under way, or a peer runs a release
// that adds members without the rule for it.
func (s *Server) peerUnknownField(r *http.Request, pointer string) {
	if pointer == "" {
		return
	}
	route := r.URL.Path
	s.metrics.peerUnknown.WithLabelValues(route).Inc()
	member := memberPattern(pointer)
	s.unknown.mu.Lock()
	key := route + " " + member
	first := !s.unknown.seen[key] && len(s.unknown.seen) < maxUnknownFieldsLogged
	if first {
		if s.unknown.seen == nil {
			s.unknown.seen = map[string]bool{}
		}
		s.unknown.seen[key] = true
	}
	s.unknown.mu.Unlock()
	if first {
		peerID, _ := r.Context().Value(peerKey{}).(string)
		s.log.Info("a replica sent a member this release does not know; it is ignored (a newer release beside this one?)",
			"route", route, "member", member, "peer", peerID)
	}
}

// memberPattern is a JSON pointer with its array indexes as "*"
// ("/batches/3/reports/7/age" is "/batches/*/reports/*/age").
func memberPattern(pointer string) string {
	parts := strings.Split(pointer, "/")
	for i, p := range parts {
		if p != "" && strings.Trim(p, "0123456789") == "" {
			parts[i] = "*"
		}
	}
	return strings.Join(parts, "/")
}

// mediaType is the request's media type without parameters ("" when it
// has none or it does not parse).
func mediaType(r *http.Request) string {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}
