from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path, re_path

from orchestrator.api import errors
from orchestrator.api.prometheus import metrics_view

# The admin's registrations are read here, where the pages are served, not as every process
# starts (settings: SimpleAdminConfig): a worker or a scheduler imports no admin module, nor what
# they import (django-rq's statistics views and prometheus_client among them).
admin.autodiscover()


def healthz(request):
    """The only public URL: liveness for load balancers."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    # RQ's own views (jobs, registries); django-rq requires a staff user on each of them.
    path("django-rq/", include("django_rq.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("orchestrator.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    re_path(r"^api/", errors.not_found, name="api_not_found"),
    path("", include("orchestrator.web.urls")),
]

# JSON errors under /api/ and /metrics, Django's pages elsewhere.
handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.page_not_found
handler500 = errors.server_error
