package ownerread

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
)

// PreviewPath is where a replica asks a service's owner to replay a
// proposed contract (POST, signed with the region's key).
const PreviewPath = "/v1/peer/contract-preview"

// kindPreview labels the contract previews asked of owners.
const kindPreview kind = "preview"

// Previewer replays a proposed contract on a service's evidence
// (evaluator.Evaluator.PreviewContract). The replay reads the windows in
// PostgreSQL, but also the instances' readiness and the windows not yet
// flushed, which only the owner holds.
type Previewer interface {
	PreviewContract(ctx context.Context, p registry.ContractPreview) (preview.Result, error)
}

// PreviewBody is the body of POST /v1/peer/contract-preview: a preview
// the asking replica has authorised, validated and audited
// (registry.PreviewContract).
type PreviewBody struct {
	Service  registry.Service        `json:"service"`
	Current  registry.StoredContract `json:"current"`
	Proposed registry.Contract       `json:"proposed"`
}

// ContractPreview returns the body's preview.
func (b PreviewBody) ContractPreview() registry.ContractPreview {
	return registry.ContractPreview{Service: b.Service, Current: b.Current, Proposed: b.Proposed}
}

// PreviewContract replays p on its owner: this replica's evaluator when
// it answers for the service, else the owner's, asked within Timeout. An
// owner that does not answer is an *OwnerUnreachableError.
func (r *Reader) PreviewContract(ctx context.Context, p registry.ContractPreview) (preview.Result, error) {
	pv, ok := r.cfg.Evaluator.(Previewer)
	if !ok {
		return preview.Result{}, errors.New("ownerread: the evaluator cannot preview contracts")
	}
	owner, local := r.local(p.Service.Name)
	if local {
		return pv.PreviewContract(ctx, p)
	}
	body, err := json.Marshal(PreviewBody{Service: p.Service, Current: p.Current, Proposed: p.Proposed})
	if err != nil {
		return preview.Result{}, fmt.Errorf("encode the preview for %s: %w", owner, err)
	}
	var out preview.Result
	for _, peer := range r.cfg.Peers() {
		if peer.ID != owner {
			continue
		}
		result, err := r.post(ctx, peer, PreviewPath, body, &out)
		r.metrics.requests.WithLabelValues(string(kindPreview), result).Inc()
		if err != nil {
			return preview.Result{}, &OwnerUnreachableError{Service: p.Service.Name, Owner: owner, Err: err}
		}
		return out, nil
	}
	r.metrics.requests.WithLabelValues(string(kindPreview), "no_address").Inc()
	return preview.Result{}, &OwnerUnreachableError{Service: p.Service.Name, Owner: owner,
		Err: fmt.Errorf("replica %s is not among the live replicas with an address", owner)}
}

// post is one signed POST of a JSON body; result labels the outcome. A
// replay takes longer than a read, so it is given twice the timeout.
func (r *Reader) post(ctx context.Context, p Peer, path string, body []byte, into any) (result string, err error) {
	if p.Address == "" {
		return "no_address", fmt.Errorf("replica %s advertises no address", p.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(p.Address, "/")+path, bytes.NewReader(body))
	if err != nil {
		return "unsendable", fmt.Errorf("build the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := r.cfg.Signer.Sign(ctx, req, p.ID, body); err != nil {
		return "unsendable", fmt.Errorf("sign the request: %w", err)
	}
	res, err := r.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "timeout", fmt.Errorf("no answer within %s: %w", 2*r.cfg.Timeout, err)
		}
		return "unreachable", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return "unreachable", fmt.Errorf("read the answer: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return "refused", fmt.Errorf("it answered %s: %s", res.Status, strings.TrimSpace(string(b[:min(len(b), 512)])))
	}
	if err := json.Unmarshal(b, into); err != nil {
		return "malformed", fmt.Errorf("decode the answer: %w", err)
	}
	return "ok", nil
}
