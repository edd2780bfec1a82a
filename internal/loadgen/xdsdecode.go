package loadgen

import (
	"errors"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The field numbers the wire decoder reads, taken from the generated
// descriptors so that they cannot drift from the schema.
var (
	fieldCLAEndpoints    = fieldNumber(&endpoint.ClusterLoadAssignment{}, "endpoints")
	fieldLocalityLbEps   = fieldNumber(&endpoint.LocalityLbEndpoints{}, "lb_endpoints")
	fieldLbEpEndpoint    = fieldNumber(&endpoint.LbEndpoint{}, "endpoint")
	fieldLbEpHealth      = fieldNumber(&endpoint.LbEndpoint{}, "health_status")
	fieldEndpointAddress = fieldNumber(&endpoint.Endpoint{}, "address")
	fieldAddressSocket   = fieldNumber(&core.Address{}, "socket_address")
	fieldSocketAddress   = fieldNumber(&core.SocketAddress{}, "address")
	fieldSocketPort      = fieldNumber(&core.SocketAddress{}, "port_value")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic(fmt.Sprintf("loadgen: %s has no field %s", m.ProtoReflect().Descriptor().FullName(), name))
	}
	return f.Number()
}

var errWire = errors.New("malformed ClusterLoadAssignment")

// decodeAssignmentWire appends every endpoint of an encoded
// ClusterLoadAssignment to l, each with its SocketAddress's encoding
// (which names the endpoint: socketAddress decodes it) and its health
// status, walking the wire format instead of building the message:
// protobuf-go's Unmarshal allocates every nested message of each of the
// assignment's endpoints (about 50 µs for 60 endpoints here), and
// 10,000 streams decoding on the cores muster runs on would time the
// client, not muster. One pass: each level's fields are read once, the
// ones not needed skipped by their length. `muster loadgen xds --decode
// proto` decodes with Unmarshal instead; TestDecodeAssignmentWire holds
// the two alike.
func decodeAssignmentWire(b []byte, l *lgListing) error {
	for len(b) > 0 {
		n, v, _, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		if n != fieldCLAEndpoints || v == nil {
			continue
		}
		for len(v) > 0 {
			var e []byte
			if tag, w, _, rest, ok := short(v); ok {
				if v = rest; tag != tagLocalityLbEps {
					continue
				}
				e = w
			} else {
				n, w, _, rest, err := field(v)
				if err != nil {
					return err
				}
				if v = rest; n != fieldLocalityLbEps || w == nil {
					continue
				}
				e = w
			}
			sa, health, err := lbEndpoint(e)
			if err != nil {
				return err
			}
			l.add(sa, health)
		}
	}
	return nil
}

// The one-byte tags of the fields read in muster's layout (-1: not one
// byte, which would leave that layout to the general walk).
var (
	tagLocalityLbEps   = oneByteTag(fieldLocalityLbEps, protowire.BytesType)
	tagLbEpEndpoint    = oneByteTag(fieldLbEpEndpoint, protowire.BytesType)
	tagEndpointAddress = oneByteTag(fieldEndpointAddress, protowire.BytesType)
	tagAddressSocket   = oneByteTag(fieldAddressSocket, protowire.BytesType)
	tagLbEpHealth      = oneByteTag(fieldLbEpHealth, protowire.VarintType)
)

func oneByteTag(n protowire.Number, t protowire.Type) int {
	if tag := protowire.EncodeTag(n, t); tag < 0x80 {
		return int(tag)
	}
	return -1
}

// short reads a field whose tag and length (or varint value) are one
// byte each, as most of an assignment's are: its tag, and its bytes
// (length-delimited) or value (varint) and what follows. ok is false
// for any other field (or a truncated one), which field then reads.
func short(b []byte) (tag int, v []byte, x byte, rest []byte, ok bool) {
	if len(b) < 2 || b[0] >= 0x80 || b[1] >= 0x80 || b[0]>>3 == 0 {
		return 0, nil, 0, nil, false
	}
	switch tag, l := int(b[0]), int(b[1]); protowire.Type(tag & 7) {
	case protowire.BytesType:
		if l+2 <= len(b) {
			return tag, b[2 : l+2 : l+2], 0, b[l+2:], true
		}
	case protowire.VarintType:
		return tag, nil, b[1], b[2:], true
	}
	return 0, nil, 0, nil, false
}

// lbEndpoint is an LbEndpoint's SocketAddress encoding and health. Of
// repeated occurrences of a message field (which protobuf merges) the
// last SocketAddress found wins; muster writes each once.
//
// muster writes an LbEndpoint's Endpoint holding only an Address holding
// only a SocketAddress, with one-byte tags and lengths: that is
// recognised from its first six bytes (tags, and lengths that nest
// exactly) rather than walked level by level, and the other short fields
// are read or skipped in place; anything else is walked with field.
func lbEndpoint(b []byte) (sa []byte, health core.HealthStatus, err error) {
	for len(b) > 0 {
		if tag, v, x, rest, ok := short(b); ok {
			switch {
			case tag == tagLbEpHealth:
				health, b = core.HealthStatus(x), rest
				continue
			case tag == tagLbEpEndpoint:
				if l := len(v); l >= 4 && int(v[0]) == tagEndpointAddress && int(v[1]) == l-2 && int(v[2]) == tagAddressSocket && int(v[3]) == l-4 {
					sa, b = v[4:], rest
					continue
				}
			default: // a field not read
				b = rest
				continue
			}
		}
		n, v, x, rest, err := field(b)
		if err != nil {
			return nil, 0, err
		}
		b = rest
		switch {
		case n == fieldLbEpHealth && v == nil:
			health = core.HealthStatus(x)
		case n == fieldLbEpEndpoint && v != nil:
			for len(v) > 0 { // the Endpoint
				n, a, _, rest, err := field(v)
				if err != nil {
					return nil, 0, err
				}
				v = rest
				if n != fieldEndpointAddress || a == nil {
					continue
				}
				for len(a) > 0 { // its Address
					n, s, _, rest, err := field(a)
					if err != nil {
						return nil, 0, err
					}
					a = rest
					if n == fieldAddressSocket && s != nil {
						sa = s
					}
				}
			}
		}
	}
	return sa, health, nil
}

// socketAddress decodes a SocketAddress's address and port.
func socketAddress(b []byte) (lgEndpoint, error) {
	var ep lgEndpoint
	for len(b) > 0 {
		n, v, x, rest, err := field(b)
		if err != nil {
			return lgEndpoint{}, err
		}
		b = rest
		switch {
		case n == fieldSocketAddress && v != nil:
			ep.addr = string(v)
		case n == fieldSocketPort && v == nil:
			ep.port = uint32(x)
		}
	}
	return ep, nil
}

// field consumes one field of a message's encoding: its number, its
// bytes when length-delimited (else nil) or its value when a varint.
// Tags, lengths and small values are one byte in muster's messages, so
// that case is read here rather than by protowire.
func field(b []byte) (n protowire.Number, v []byte, x uint64, rest []byte, err error) {
	var tag uint64
	k := 1
	if len(b) > 0 && b[0] < 0x80 {
		tag = uint64(b[0])
	} else if tag, k = protowire.ConsumeVarint(b); k < 0 {
		return 0, nil, 0, nil, errWire
	}
	n, t := protowire.DecodeTag(tag)
	if n < protowire.MinValidNumber {
		return 0, nil, 0, nil, errWire
	}
	b = b[k:]
	switch t {
	case protowire.BytesType:
		var l uint64
		if len(b) > 0 && b[0] < 0x80 {
			l, k = uint64(b[0]), 1
		} else if l, k = protowire.ConsumeVarint(b); k < 0 {
			return 0, nil, 0, nil, errWire
		}
		if l > uint64(len(b)-k) {
			return 0, nil, 0, nil, errWire
		}
		end := k + int(l)
		return n, b[k:end:end], 0, b[end:], nil // never nil: b is not
	case protowire.VarintType:
		if len(b) > 0 && b[0] < 0x80 {
			return n, nil, uint64(b[0]), b[1:], nil
		}
		x, k = protowire.ConsumeVarint(b)
	default:
		k = protowire.ConsumeFieldValue(n, t, b)
	}
	if k < 0 {
		return 0, nil, 0, nil, errWire
	}
	return n, nil, x, b[k:], nil
}
