package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// keyRefetchInterval is the least time between two fetches of one
// issuer's key set. go-oidc's RemoteKeySet refetches on every token whose
// key it does not hold, so a forged token with a fresh "kid" cost one
// fetch each; here, after a fetch, a token signed by a key muster does
// not hold is refused without asking the issuer again until this has
// passed. A real key rotation is seen within it.
const keyRefetchInterval = 10 * time.Second

// keyRetryAfterFailure is the least time between fetches while the last
// one failed. A failure is not a reason to hold off as long as a forged
// key ID is: at a start, or after an issuer's blip, muster holds no
// usable key and refuses every token until a fetch succeeds, and a
// 10 s lockout would let leases lapse for want of a renewal that could
// have landed (fail-static).
const keyRetryAfterFailure = time.Second

// maxKeySetBytes bounds a key set document; real ones are a few KiB.
const maxKeySetBytes = 1 << 20

// keySet is one issuer's signing keys, fetched from its jwks_uri. It is
// the oidc.KeySet of the issuer's verifier (go-oidc checks the algorithm
// and the claims; this checks the signature), and fetches at most once
// per keyRefetchInterval whatever the tokens presented: a token whose key
// ID is held but whose signature is wrong costs no fetch at all, one with
// an unknown key ID costs one only when the last fetch is older than the
// interval. Concurrent callers share one fetch. It is safe for concurrent
// use.
type keySet struct {
	url    string
	client *http.Client
	now    func() time.Time

	mu        sync.Mutex
	keys      []jose.JSONWebKey
	lastFetch time.Time     // when the last fetch started; zero before the first
	lastErr   error         // the last fetch's failure, nil after a success
	pending   chan struct{} // non-nil while a fetch runs; closed when it ends
}

func newKeySet(url string, client *http.Client, now func() time.Time) *keySet {
	return &keySet{url: url, client: client, now: now}
}

// errUnknownKey is returned when no held key verifies the token and the
// key set may not be fetched again yet. Its text is matched by
// verifyError through go-oidc's "failed to verify signature" wrapping.
var errUnknownKey = errors.New("no key of the issuer verifies the token (key set fetched less than 10s ago)")

// VerifySignature implements oidc.KeySet.
func (k *keySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	// go-oidc has parsed the token and checked its algorithm already; it
	// is parsed again here because the parsed form is private to go-oidc.
	jws, err := jose.ParseSignedCompact(raw, routingAlgs())
	if err != nil || len(jws.Signatures) != 1 {
		return nil, errors.New("malformed jwt")
	}
	kid := jws.Signatures[0].Header.KeyID

	k.mu.Lock()
	keys := k.keys
	k.mu.Unlock()
	if payload, held := verifyWith(jws, keys, kid); payload != nil {
		return payload, nil
	} else if held {
		// The key is ours and the signature is wrong: a new key set would
		// not change that.
		return nil, errors.New("signature does not verify with the issuer's key")
	}
	keys, err = k.refresh(ctx)
	if err != nil {
		return nil, err
	}
	if payload, _ := verifyWith(jws, keys, kid); payload != nil {
		return payload, nil
	}
	return nil, errors.New("no key of the issuer verifies the token")
}

// verifyWith tries the keys with the token's key ID (every key when it
// names none). held reports that some key had that ID.
func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) (payload []byte, held bool) {
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		held = kid != ""
		if p, err := jws.Verify(&keys[i]); err == nil {
			return p, held
		}
	}
	return nil, held
}

// refresh fetches the key set unless the last fetch started less than
// keyRefetchInterval ago, in which case it answers errUnknownKey, or the
// last fetch's error while that one failed. A fetch runs detached from
// ctx with its own timeout, so one impatient caller cannot fail it for
// the others; the caller only stops waiting.
func (k *keySet) refresh(ctx context.Context) ([]jose.JSONWebKey, error) {
	k.mu.Lock()
	if k.pending == nil {
		wait := keyRefetchInterval
		if k.lastErr != nil {
			wait = keyRetryAfterFailure
		}
		if !k.lastFetch.IsZero() && k.now().Sub(k.lastFetch) < wait {
			err := k.lastErr
			k.mu.Unlock()
			if err != nil {
				return nil, fmt.Errorf("fetching keys (retried after %s): %w", keyRetryAfterFailure, err)
			}
			return nil, errUnknownKey
		}
		k.lastFetch = k.now()
		k.pending = make(chan struct{})
		go k.fetch(context.WithoutCancel(ctx), k.pending)
	}
	pending := k.pending
	k.mu.Unlock()

	select {
	case <-pending:
	case <-ctx.Done():
		return nil, fmt.Errorf("fetching keys: %w", ctx.Err())
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lastErr != nil {
		return nil, fmt.Errorf("fetching keys: %w", k.lastErr)
	}
	return k.keys, nil
}

// fetch reads the key set, records the outcome and closes done. A failed
// fetch keeps the keys held before it.
func (k *keySet) fetch(ctx context.Context, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	keys, err := k.get(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil {
		k.keys = keys
	}
	k.lastErr = err
	k.pending = nil
	close(done)
}

func (k *keySet) get(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Cache-Control", "no-cache")
	res, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxKeySetBytes))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", k.url, res.Status)
	}
	return parseKeySet(body)
}

// parseKeySet decodes a JWK set, skipping keys muster cannot use (an
// algorithm it does not verify, a key type go-jose does not know) rather
// than refusing the whole set, as go-oidc does and RFC 7517 §5 asks.
func parseKeySet(body []byte) ([]jose.JSONWebKey, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("decode key set: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, m := range raw.Keys {
		var meta struct {
			Alg string `json:"alg"`
			Use string `json:"use"`
		}
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, fmt.Errorf("decode key set: %w", err)
		}
		if (meta.Alg != "" && !routingAlg(meta.Alg)) || (meta.Use != "" && meta.Use != "sig") {
			continue
		}
		var key jose.JSONWebKey
		if err := json.Unmarshal(m, &key); err != nil {
			if errors.Is(err, jose.ErrUnsupportedKeyType) {
				continue
			}
			return nil, fmt.Errorf("decode key set: %w", err)
		}
		if !key.IsPublic() {
			continue
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func routingAlg(alg string) bool {
	for _, a := range routingAlgs() {
		if string(a) == alg {
			return true
		}
	}
	return false
}
