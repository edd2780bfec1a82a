package relay_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/stream"
)

// viewSigner signs as replica "a" with the region's test key.
var viewSigner = assembler.SignWith("a", apptest.SealKey().KeyID(),
	func(msg []byte) ([]byte, error) { return apptest.SealKey().Sign(context.Background(), msg) }, nil)

// endpoints are n endpoints of a service, the same at every version.
func endpoints(n int) []assembler.Endpoint {
	out := make([]assembler.Endpoint, n)
	for i := range out {
		out[i] = assembler.Endpoint{InstanceID: uuid.UUID{byte(i >> 8), byte(i), 15: 1}, Address: fmt.Sprintf("10.0.0.%d", i%250),
			Port: 8080, Zone: "a", State: "eligible", Weight: 1, Health: "known", Capabilities: []string{}}
	}
	return out
}

// signedFrame is a view or delta of service at v (a delta from from),
// signed as the region's key signs, carrying eps; extra is spliced in as
// further fields, and the spacing is not encoding/json's, so a test sees
// whether the bytes travel verbatim.
func signedFrame(kind stream.Kind, service string, from, v uint64, eps []assembler.Endpoint, extra string) *stream.Frame {
	sum := assembler.Checksum(eps)
	sig, _ := json.Marshal(viewSigner(service, v, sum, assembler.ZonesDigest(nil)))
	var body []byte
	if kind == stream.KindDelta {
		body = fmt.Appendf(nil, `{ "service": %q, "from_version":%d, "version": %d, "checksum": %q, "signature": %s%s }`, service, from, v, sum, sig, extra)
	} else {
		e, _ := json.Marshal(eps)
		body = fmt.Appendf(nil, `{ "service": %q, "version": %d, "endpoints": %s, "zones": {}, "checksum": %q, "signature": %s%s }`, service, v, e, sum, sig, extra)
	}
	return &stream.Frame{Kind: kind, Service: service, FromVersion: from, Version: v, JSON: body}
}
