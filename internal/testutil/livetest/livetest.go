// Package livetest runs the live API (internal/liveapi) inside a test, reached through a real
// kube-apiserver with the aggregation layer (internal/testutil/aggregatortest), and binds the
// roles that config/rbac ships, so that tests act as tenants and operators do.
package livetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// The roles of config/rbac.
const (
	RoleViewer   = "live-viewer"
	RoleRevoker  = "live-revoker"
	RoleOperator = "live-operator"
)

// Env is a control plane serving the live API.
type Env struct {
	*aggregatortest.Env
	cs kubernetes.Interface
	// port is the live API's; stop ends its server and waits for it (StopServing).
	port int
	stop func()
}

// Start starts the control plane, runs the live API over deps until ctx ends, registers it
// with its Service in deps.Tenants' system namespace, creates the tenant namespaces of
// namespaces and installs the shipped ClusterRoles.
func Start(ctx context.Context, deps liveapi.Deps, namespaces ...string) (*Env, error) {
	agg, err := aggregatortest.Start()
	if err != nil {
		return nil, err
	}
	e := &Env{Env: agg}
	if err := e.start(ctx, deps, namespaces); err != nil {
		_ = agg.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) start(ctx context.Context, deps liveapi.Deps, namespaces []string) error {
	l, port, err := aggregatortest.FreePort()
	if err != nil {
		return err
	}
	e.port = port
	if err := e.serve(ctx, l, deps); err != nil {
		return err
	}
	if err := e.Register(ctx, livev1alpha1.GroupVersion, deps.Tenants.SystemNamespace(), port); err != nil {
		return fmt.Errorf("registering the live API: %w", err)
	}
	if e.cs, err = kubernetes.NewForConfig(e.Config); err != nil {
		return err
	}
	for _, ns := range namespaces {
		_, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return e.installRoles(ctx)
}

// serve runs the live API over deps on l until ctx ends or StopServing.
func (e *Env) serve(ctx context.Context, l net.Listener, deps liveapi.Deps) error {
	srv, err := liveapi.New(liveapi.Options{Listener: l, Kubeconfig: e.AdminKubeconfig}, deps)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Run(ctx)
	}()
	e.stop = func() { cancel(); <-done }
	return nil
}

// StopServing stops the live API's server, as a manager that goes away does: its watches
// end, and the API answers 503 until Serve.
func (e *Env) StopServing() { e.stop() }

// Serve serves deps in place of the stopped server, on the same port, until ctx ends: a
// restarted manager.
func (e *Env) Serve(ctx context.Context, deps liveapi.Deps) error {
	var l net.Listener
	var err error
	for range 50 { // the port is free again once the old server's listener has closed
		if l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port))); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // real time: the kernel frees the port
	}
	if err != nil {
		return fmt.Errorf("listening on the live API's port %d again: %w", e.port, err)
	}
	return e.serve(ctx, l, deps)
}

// installRoles creates the ClusterRoles of config/rbac as they ship.
func (e *Env) installRoles(ctx context.Context) error {
	root, err := mongotest.RepoRoot()
	if err != nil {
		return err
	}
	for _, f := range []string{"live_viewer_role.yaml", "live_revoker_role.yaml", "live_operator_role.yaml"} {
		var role rbacv1.ClusterRole
		b, err := os.ReadFile(filepath.Join(root, "config", "rbac", f))
		if err != nil {
			return err
		}
		if err := yaml.UnmarshalStrict(b, &role); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := e.cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// Bind binds user to the ClusterRoles in namespace, as a platform team grants a tenant its
// view: a RoleBinding per role.
func (e *Env) Bind(ctx context.Context, user, namespace string, roles ...string) error {
	for _, r := range roles {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user + "-" + r, Namespace: namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if _, err := e.cs.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// BindCluster binds user to a ClusterRole everywhere.
func (e *Env) BindCluster(ctx context.Context, user, role string) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	_, err := e.cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	return err
}
