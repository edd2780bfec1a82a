package loadgen

import (
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// The load generator's ADS streams carry their messages as their
// encoding (lgRawMsg): each stream walks a response's wire format for
// what an Envoy reads of it (version, nonce, type, every resource, and
// every endpoint of each assignment) and writes its ACK by hand, rather
// than having gRPC's proto codec build a DiscoveryResponse (which copies
// each resource's bytes into an Any and allocates every message) and
// marshal a DiscoveryRequest. The client shares muster's cores, so its
// cost per message is on the clock of what it measures. `--decode proto`
// keeps protobuf-go's Unmarshal for the whole response and the
// assignments; TestXDSRawMessages holds the hand encoder and decoder to
// protobuf-go's.

// The field numbers of the discovery messages, from the generated
// descriptors so that they cannot drift from the schema.
var (
	fieldRespVersion   = fieldNumber(&discovery.DiscoveryResponse{}, "version_info")
	fieldRespResources = fieldNumber(&discovery.DiscoveryResponse{}, "resources")
	fieldRespTypeURL   = fieldNumber(&discovery.DiscoveryResponse{}, "type_url")
	fieldRespNonce     = fieldNumber(&discovery.DiscoveryResponse{}, "nonce")
	fieldAnyValue      = fieldNumber(&anypb.Any{}, "value")

	fieldDeltaRespResources = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "resources")
	fieldDeltaRespTypeURL   = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "type_url")
	fieldDeltaRespNonce     = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "nonce")
	fieldDeltaRespRemoved   = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "removed_resources")
	fieldResourceName       = fieldNumber(&discovery.Resource{}, "name")
	fieldResourceVersion    = fieldNumber(&discovery.Resource{}, "version")
	fieldResourceResource   = fieldNumber(&discovery.Resource{}, "resource")

	fieldReqVersion = fieldNumber(&discovery.DiscoveryRequest{}, "version_info")
	fieldReqNames   = fieldNumber(&discovery.DiscoveryRequest{}, "resource_names")
	fieldReqTypeURL = fieldNumber(&discovery.DiscoveryRequest{}, "type_url")
	fieldReqNonce   = fieldNumber(&discovery.DiscoveryRequest{}, "response_nonce")

	fieldDeltaReqTypeURL = fieldNumber(&discovery.DeltaDiscoveryRequest{}, "type_url")
	fieldDeltaReqNonce   = fieldNumber(&discovery.DeltaDiscoveryRequest{}, "response_nonce")
)

// lgRawMsg is a gRPC message as its encoding. A received one holds its
// buffer (gRPC's, not copied when the message came in one piece) until
// free.
type lgRawMsg struct {
	b   []byte
	buf mem.Buffer
}

func (m *lgRawMsg) free() {
	if m.buf != nil {
		m.buf.Free()
	}
	m.b, m.buf = nil, nil
}

// lgRawCodec passes lgRawMsg through as it is and leaves any other
// message (the first request; every message with --decode proto) to
// gRPC's proto codec. It is named "proto" since it is the content
// subtype the server expects.
type lgRawCodec struct{}

var lgProtoCodec = encoding.GetCodecV2("proto")

func (lgRawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*lgRawMsg); ok {
		// gRPC writes the bytes after SendMsg returns, so each ACK has
		// bytes of its own (a small allocation) rather than a buffer
		// the stream would reuse before they are written.
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	}
	return lgProtoCodec.Marshal(v)
}

func (lgRawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*lgRawMsg); ok {
		// One piece (the usual case): a reference, not a copy.
		m.buf = data.MaterializeToBuffer(mem.DefaultBufferPool())
		m.b = m.buf.ReadOnlyData()
		return nil
	}
	return lgProtoCodec.Unmarshal(data, v)
}

func (lgRawCodec) Name() string { return "proto" }

// lgRawStream is the call option that makes a stream carry lgRawMsg.
var lgRawStream = grpc.ForceCodecV2(lgRawCodec{})

// lgResponse is what a stream reads of a DiscoveryResponse or a
// DeltaDiscoveryResponse: slices of the received bytes, valid until the
// message is freed. Its slices are reused from response to response.
type lgResponse struct {
	version, typeURL, nonce []byte
	// resources is each resource's Any's value (SotW) or each Resource's
	// (delta; nil when it has none), names and versions each Resource's
	// name and version (delta), removed the removed resources' names.
	resources, names, versions, removed [][]byte
}

func (r *lgResponse) reset() {
	r.version, r.typeURL, r.nonce = nil, nil, nil
	r.resources, r.names, r.versions, r.removed = r.resources[:0], r.names[:0], r.versions[:0], r.removed[:0]
}

// decodeResponse reads an encoded DiscoveryResponse into r. Like
// protobuf-go it takes the last of a repeated scalar field and skips
// fields it does not read, whatever their type.
func decodeResponse(b []byte, r *lgResponse) error {
	r.reset()
	for len(b) > 0 {
		n, v, _, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		if v == nil {
			continue
		}
		switch n {
		case fieldRespVersion:
			r.version = v
		case fieldRespTypeURL:
			r.typeURL = v
		case fieldRespNonce:
			r.nonce = v
		case fieldRespResources:
			value, err := anyValue(v)
			if err != nil {
				return err
			}
			r.resources = append(r.resources, value)
		}
	}
	return nil
}

// decodeDeltaResponse reads an encoded DeltaDiscoveryResponse into r.
func decodeDeltaResponse(b []byte, r *lgResponse) error {
	r.reset()
	for len(b) > 0 {
		n, v, _, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		if v == nil {
			continue
		}
		switch n {
		case fieldDeltaRespTypeURL:
			r.typeURL = v
		case fieldDeltaRespNonce:
			r.nonce = v
		case fieldDeltaRespRemoved:
			r.removed = append(r.removed, v)
		case fieldDeltaRespResources:
			var name, version, value []byte
			for len(v) > 0 {
				n, w, _, rest, err := field(v)
				if err != nil {
					return err
				}
				v = rest
				if w == nil {
					continue
				}
				switch n {
				case fieldResourceName:
					name = w
				case fieldResourceVersion:
					version = w
				case fieldResourceResource:
					// Occurrences of a message field merge: a later
					// one without a value keeps the earlier value.
					if w, err = anyValue(w); err != nil {
						return err
					} else if w != nil {
						value = w
					}
				}
			}
			r.resources, r.names, r.versions = append(r.resources, value), append(r.names, name), append(r.versions, version)
		}
	}
	return nil
}

// anyValue is an encoded Any's value (nil when it has none).
func anyValue(b []byte) ([]byte, error) {
	var value []byte
	for len(b) > 0 {
		n, v, _, rest, err := field(b)
		if err != nil {
			return nil, err
		}
		b = rest
		if n == fieldAnyValue && v != nil {
			value = v
		}
	}
	return value, nil
}

// appendACK appends a state-of-the-world ACK: a DiscoveryRequest with
// the response's type, version and nonce and the stream's one resource
// name.
func appendACK(b []byte, typeURL []byte, name string, version, nonce []byte) []byte {
	b = appendString(b, fieldReqVersion, version)
	// A repeated field's element is written even when empty.
	b = protowire.AppendTag(b, fieldReqNames, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = appendString(b, fieldReqTypeURL, typeURL)
	return appendString(b, fieldReqNonce, nonce)
}

// appendDeltaACK appends a delta ACK: a DeltaDiscoveryRequest with the
// response's type and nonce.
func appendDeltaACK(b []byte, typeURL, nonce []byte) []byte {
	b = appendString(b, fieldDeltaReqTypeURL, typeURL)
	return appendString(b, fieldDeltaReqNonce, nonce)
}

// appendString appends a proto3 string field, which is not written when
// empty.
func appendString(b []byte, n protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// stringSize bounds appendString's length.
func stringSize(n protowire.Number, v []byte) int {
	return protowire.SizeTag(n) + protowire.SizeBytes(len(v))
}
