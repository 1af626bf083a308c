package app

import (
	"strconv"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/extproc"
)

// bindExtprocFlags binds the ext_proc server's flags to o.
func bindExtprocFlags(fs *pflag.FlagSet, o *extproc.Options) {
	if o.GRPCPort == 0 {
		o.GRPCPort = extproc.DefaultGRPCPort
	}
	if o.HealthPort == 0 {
		o.HealthPort = extproc.DefaultHealthPort
	}
	if o.MaxRequestBodyBytes == 0 {
		o.MaxRequestBodyBytes = extproc.DefaultMaxRequestBodyBytes
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = extproc.DefaultDrainTimeout
	}
	fs.IntVar(&o.GRPCPort, "grpc-port", o.GRPCPort, "Port of the ext_proc gRPC server gateways connect to.")
	fs.IntVar(&o.HealthPort, "grpc-health-port", o.HealthPort, "Port of the gRPC health server (liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); always plaintext.")
	secure := fs.VarPF(&invertedBool{p: &o.Insecure}, "secure-serving", "", "Serve ext_proc over TLS (1.2+, ALPN h2).")
	secure.DefValue = "true"
	secure.NoOptDefVal = "true"
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "Directory holding tls.crt and tls.key for ext_proc TLS; empty makes a self-signed certificate at start.")
	fs.BoolVar(&o.EnableCertReload, "enable-cert-reload", o.EnableCertReload, "Reload --cert-path's files when they change.")
	fs.IntVar(&o.MaxRequestBodyBytes, "max-request-body-bytes", o.MaxRequestBodyBytes, "Largest request body held for parsing; larger bodies are answered 413.")
	fs.BoolVar(&o.TrustPoolHeader, "trust-pool-header", o.TrustPoolHeader, "Let the request header x-gateway-inference-pool name the pool. Only when the gateway sets it and strips client copies: clients can forge headers.")
	fs.BoolVar(&o.EnableConformanceTestBehaviors, "enable-conformance-test-behaviors", o.EnableConformanceTestBehaviors, "Honour the conformance suite's test-epp-endpoint-selection header and echo the served endpoint. Never in production.")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "How long to let open streams finish on shutdown before cutting them.")
}

// invertedBool is a bool flag stored negated: the flag says
// --secure-serving, the Options field says Insecure so its zero value is the
// secure default.
type invertedBool struct{ p *bool }

func (b *invertedBool) String() string {
	if b == nil || b.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*b.p)
}

func (b *invertedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.p = !v
	return nil
}

func (b *invertedBool) Type() string { return "bool" }
