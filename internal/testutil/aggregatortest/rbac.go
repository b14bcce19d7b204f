package aggregatortest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// InstallClusterRoles creates the ClusterRoles shipped in the repository's config/rbac
// files, so that tests authorize users exactly as the manifests do.
func (e *Env) InstallClusterRoles(ctx context.Context, files ...string) error {
	root, err := mongotest.RepoRoot()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	for _, f := range files {
		var role rbacv1.ClusterRole
		b, err := os.ReadFile(filepath.Join(root, "config", "rbac", f))
		if err != nil {
			return err
		}
		if err := yaml.UnmarshalStrict(b, &role); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
		}
	}
	return nil
}

// BindInNamespace binds user to each of clusterRoles in namespace ns (RoleBindings named
// user-role).
func (e *Env) BindInNamespace(ctx context.Context, user, ns string, clusterRoles ...string) error {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	for _, r := range clusterRoles {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user + "-" + r, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("binding %s to %s in %s: %w", user, r, ns, err)
		}
	}
	return nil
}
